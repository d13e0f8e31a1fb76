// Keeps every thread of the calling thread's OpenMP team running, yielding, for a while: the device loop
// calls it between steps for a short time after the last one, so that the next request's step does not
// start by waking cores from idle.
//
// Why: on the VM this was measured on (2 vCPUs), a core idle for more than ~50 ms took 8-12 ms to get
// going again: the first parallel op after 100 ms of quiet took 7.8 ms instead of 0.03, and a one-token
// decode step 16 ms instead of 5. llama.cpp's threads poll for work after each graph the same way (its
// ``--poll`` 50), as Intel's OpenMP spins 200 ms (KMP_BLOCKTIME). The threads yield while they wait, so
// anything else that wants the core (the HTTP thread, another process) runs.

#include <ATen/Parallel.h>
#include <sched.h>
#include <torch/library.h>

#include <chrono>
#include <cstdint>

namespace {

void keep_warm(int64_t micros) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    while (std::chrono::steady_clock::now() < until) sched_yield();
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(homeai, m) { m.def("keep_warm(int micros) -> ()"); }
TORCH_LIBRARY_IMPL(homeai, CatchAll, m) { m.impl("keep_warm", &keep_warm); }
