"""HomeAI Gateway: workload classes sharing one accelerator through one batcher."""

import os

# The device loop shares the CPU with the event loop, the HTTP server and the rest of a home server.
# OpenMP threads that spin while waiting stall every small torch op when another thread holds a core
# (measured here: a decode step 308 ms spinning, 94 ms passive, with one other busy process on 2
# cores). Set before torch is imported; an explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
