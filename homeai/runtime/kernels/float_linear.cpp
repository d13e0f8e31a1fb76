// float32 linear layer over weights packed in panels of 32 output columns: y = x @ W^T.
//
// Why: a decode step of a small model multiplies 2-64 rows by every weight matrix. MKL's GEMM reads the
// weights as they lie ([N, K] rows) and reaches 150 GFLOP/s at 32 rows on the 2-core Xeon this was
// measured on (`homeai bench kernels`); with the weights stored once in panels
// ([ceil(N/32), K, 32], the same bytes) an outer-product loop keeps 8 rows x 32 columns of results in
// registers and streams each panel once per 8 rows: 1.3x at 32 rows, 1.5-2x at 4-16, even at one row and
// at prompt sizes. AVX-512 only: elsewhere the weights stay unpacked and MKL serves (homeai.runtime.quant).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma")
namespace {

constexpr int64_t kPanel = 32;     // output columns per panel: two registers
constexpr int kMaxRows = 8;        // activation rows per pass over a panel: 16 accumulators
constexpr int64_t kRowChunk = 128;  // rows per sweep over all panels, so a prompt's rows stay in L2

// Rows [0, MR) of x against one panel: out[j, 0:cols] = x[j] @ panel (cols <= 32 valid columns).
template <int MR>
inline void panel_rows(const float* x, int64_t ldx, const float* panel, int64_t K, float* out, int64_t ldo,
                       __mmask16 lo, __mmask16 hi) {
  __m512 a0[MR], a1[MR];
  for (int j = 0; j < MR; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* p = panel + k * kPanel;
    _mm_prefetch(reinterpret_cast<const char*>(p + 16 * kPanel), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p + 16 * kPanel + 16), _MM_HINT_T0);
    const __m512 w0 = _mm512_loadu_ps(p), w1 = _mm512_loadu_ps(p + 16);
    for (int j = 0; j < MR; ++j) {
      const __m512 xb = _mm512_set1_ps(x[j * ldx + k]);
      a0[j] = _mm512_fmadd_ps(xb, w0, a0[j]);
      a1[j] = _mm512_fmadd_ps(xb, w1, a1[j]);
    }
  }
  for (int j = 0; j < MR; ++j) {
    _mm512_mask_storeu_ps(out + j * ldo, lo, a0[j]);
    _mm512_mask_storeu_ps(out + j * ldo + 16, hi, a1[j]);
  }
}

using PanelFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, __mmask16, __mmask16);
constexpr PanelFn kPanelFns[kMaxRows + 1] = {nullptr, panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>,
                                             panel_rows<5>, panel_rows<6>, panel_rows<7>, panel_rows<8>};

void panels(const float* x, const float* wp, float* out, int64_t M, int64_t K, int64_t N, int64_t p0,
            int64_t p1) {
  for (int64_t pi = p0; pi < p1; ++pi) {
    const int64_t cols = std::min(kPanel, N - pi * kPanel);
    const __mmask16 lo = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
    const __mmask16 hi = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : static_cast<__mmask16>((1u << (cols - 16)) - 1);
    const float* panel = wp + pi * K * kPanel;
    for (int64_t m = 0; m < M; m += kMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, M - m));
      kPanelFns[rows](x + m * K, K, panel, K, out + m * N + pi * kPanel, N, lo, hi);
    }
  }
}

}  // namespace
#pragma GCC pop_options

namespace {

at::Tensor float_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == kPanel,
              "float_linear: x [M, K], packed [ceil(N/32), K, 32]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat, "float_linear: float32 tensors");
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "float_linear: CPU tensors");
  const int64_t M = x.size(0), K = x.size(1), P = packed.size(0);
  TORCH_CHECK(packed.size(1) == K && N > (P - 1) * kPanel && N <= P * kPanel,
              "float_linear: packed [ceil(N/32), K, 32] for x [M, K], got N=", N);
  TORCH_CHECK(__builtin_cpu_supports("avx512f"), "float_linear: needs AVX-512");
  const at::Tensor xc = x.contiguous(), pc = packed.contiguous();
  at::Tensor out = at::empty({M, N}, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = pc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t m = 0; m < M; m += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, M - m);
    at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
      panels(xp + m * K, wp, op + m * N, rows, K, N, p0, p1);
    });
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(homeai, m) { m.def("float_linear(Tensor x, Tensor packed, int N) -> Tensor"); }
TORCH_LIBRARY_IMPL(homeai, CPU, m) { m.impl("float_linear", &float_linear); }
