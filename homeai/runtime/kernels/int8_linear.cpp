// int8 weight-only linear layer for the CPU: y = (x @ q^T) * scale, with float32 activations and
// accumulation, int8 weights [N, K] with one float32 scale per output row (homeai.runtime.quant).
//
// Why a kernel of our own: decoding a token reads every weight once, and torch's _weight_int8pack_mm
// streams int8 weights at about half the machine's read bandwidth (13 of 28 GB/s on the 2-core Xeon
// this was measured on); this loop with software prefetch reaches all of it. The arithmetic is the
// dequantize-then-matmul of the weights in float32 (no bfloat16 rounding of the activations).
//
// Built at first use by torch.utils.cpp_extension (homeai.runtime.kernels); one binary carries an
// AVX-512 and an AVX2 variant and picks one at run time.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma")
namespace avx512 {
struct V {
  using reg = __m512;
  static constexpr int64_t kLanes = 16;
  static inline reg zero() { return _mm512_setzero_ps(); }
  static inline reg load(const float* p) { return _mm512_loadu_ps(p); }
  static inline reg load_int8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static inline reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static inline float sum(reg a) { return _mm512_reduce_add_ps(a); }
};
#include "int8_linear_kernel.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
struct V {
  using reg = __m256;
  static constexpr int64_t kLanes = 8;
  static inline reg zero() { return _mm256_setzero_ps(); }
  static inline reg load(const float* p) { return _mm256_loadu_ps(p); }
  static inline reg load_int8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static inline reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static inline float sum(reg a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};
#include "int8_linear_kernel.inc"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")
namespace avx512 {
// int8 -> bfloat16, exactly (every int8 value has at most 8 significant bits): the float32's upper half.
void to_bf16(const int8_t* q, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i))));
    const __m256i bf = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bf);
  }
  for (; i < n; ++i) {
    const float f = static_cast<float>(q[i]);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    out[i] = static_cast<uint16_t>(bits >> 16);
  }
}
}  // namespace avx512
#pragma GCC pop_options

namespace {

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
  return yes;
}

at::Tensor run(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, bool wide) {
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && scale.dim() == 1, "int8_linear: x [M, K], q [N, K], scale [N]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && q.scalar_type() == at::kChar && scale.scalar_type() == at::kFloat,
              "int8_linear: x float32, q int8, scale float32");
  TORCH_CHECK(x.device().is_cpu() && q.device().is_cpu() && scale.device().is_cpu(), "int8_linear: CPU tensors");
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  TORCH_CHECK(q.size(1) == K && scale.size(0) == N, "int8_linear: x [M, K], q [N, K], scale [N]");
  TORCH_CHECK(K % 16 == 0, "int8_linear: K must be a multiple of 16, got ", K);
  TORCH_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), "int8_linear: needs AVX2 and FMA");
  const at::Tensor xc = x.contiguous(), qc = q.contiguous(), sc = scale.contiguous();
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  const float* xp = xc.data_ptr<float>();
  const int8_t* qp = qc.data_ptr<int8_t>();
  const float* sp = sc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    if (wide) {
      avx512::linear(xp, qp, sp, op, M, K, N, n0, n1);
    } else {
      avx2::linear(xp, qp, sp, op, M, K, N, n0, n1);
    }
  });
  return out;
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale) {
  return run(x, q, scale, has_avx512());
}

// The AVX2 variant whatever the CPU: tests check it on machines that would pick AVX-512.
at::Tensor int8_linear_avx2(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale) {
  return run(x, q, scale, false);
}

// Writes q's values into ``out`` (bfloat16, same shape): a prompt's int8 matmul then runs in bfloat16 on a
// buffer that stays in cache, instead of torch's int8 -> bfloat16 conversion (4-10x slower here).
void int8_to_bf16(at::Tensor& out, const at::Tensor& q) {
  TORCH_CHECK(q.scalar_type() == at::kChar && out.scalar_type() == at::kBFloat16, "int8_to_bf16: int8 q, bfloat16 out");
  TORCH_CHECK(q.device().is_cpu() && out.device().is_cpu() && q.is_contiguous() && out.is_contiguous() &&
                  out.numel() == q.numel(), "int8_to_bf16: contiguous CPU tensors of one size");
  TORCH_CHECK(has_avx512(), "int8_to_bf16: needs AVX-512");
  const int8_t* qp = q.data_ptr<int8_t>();
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, q.numel(), 1 << 16, [&](int64_t i0, int64_t i1) { avx512::to_bf16(qp + i0, op + i0, i1 - i0); });
}

}  // namespace

TORCH_LIBRARY(homeai, m) {
  m.def("int8_linear(Tensor x, Tensor q, Tensor scale) -> Tensor");
  m.def("int8_linear_avx2(Tensor x, Tensor q, Tensor scale) -> Tensor");
  m.def("int8_to_bf16(Tensor(a!) out, Tensor q) -> ()");
}
TORCH_LIBRARY_IMPL(homeai, CPU, m) {
  m.impl("int8_linear", &int8_linear);
  m.impl("int8_linear_avx2", &int8_linear_avx2);
  m.impl("int8_to_bf16", &int8_to_bf16);
}
