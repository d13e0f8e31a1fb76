"""HomeAI Gateway: workload classes sharing one accelerator through one batcher."""

import os

# OpenMP threads wait for each other at the end of every parallel torch op. Measured on this 2-core
# machine (SmolLM2-135M fp32, one decode stream; `homeai bench speed`): sleeping at once
# (OMP_WAIT_POLICY=PASSIVE) 22 tok/s idle, 19 with a busy neighbour process; libgomp's default spin
# (300,000 rounds) 34 idle but 2 with the neighbour; a short spin (GOMP_SPINCOUNT=10000) 34 idle, 11 with
# the neighbour. The short spin is the default: a home server is mostly idle between requests, and a
# decode step's ops follow each other closely. A box shared with busy work can set
# OMP_WAIT_POLICY=PASSIVE. Set before torch is imported; the environment wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")

__version__ = "0.1.0"
