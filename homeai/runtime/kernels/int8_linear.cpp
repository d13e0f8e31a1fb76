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
#include <vector>

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

// The tiled variant (``int8_linear_tiled``), for a layer whose rows are many and short, such as an lm_head
// (SmolLM2's: 49,152 rows of 576): with float32 activations a decode step spends three instructions on each
// 16 weights (widen, convert, FMA) and is bound by them, not by reading the weights (1.7 ms of a 6.5 ms
// one-row step). Here activations are quantized to int16 per group of 32 (a step of absmax / 32767: their
// error is ~1e-5 of the group's largest, far below int8 activations', which moved SmolLM2's top logprobs
// by up to 0.27 nats) and one vpdpwssd multiplies 2 weights of 16 rows with 2 activations broadcast.
// Layout qt int8 [N/16, K/2, 32]: tile t, weight pair p (k = 2p, 2p+1) holds row 16t+r's pair at bytes 2r,
// 2r+1, so one 32-byte load widened to int16 is what one vpdpwssd takes (``homeai.runtime.quant.tile_int8``).
// A group's int32 sums are at most 32 * 32767 * 127 (no overflow); they turn float once per group.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,fma")
namespace vnni {

constexpr int64_t kTile = 16;
constexpr int64_t kGroup = 32;
constexpr int64_t kGroupBytes = kTile * kGroup;  // a tile's group: 16 pairs x 32 bytes
constexpr int kMaxRows = 8;                      // activation rows per pass over a tile (stays in L1)
constexpr int64_t kPrefetchGroups = 4;

struct Int16Rows {
  std::vector<int16_t> xq;  // [M, K]
  std::vector<float> sx;    // [M, K / 32]: each group's step
};

Int16Rows quantize(const float* x, int64_t M, int64_t K) {
  const int64_t G = K / kGroup;
  Int16Rows r{std::vector<int16_t>(M * K), std::vector<float>(M * G)};
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      const float* xg = x + m * K + g * kGroup;
      const __m512 a0 = _mm512_loadu_ps(xg), a1 = _mm512_loadu_ps(xg + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
      const float step = amax > 0.0f ? amax / 32767.0f : 1.0f;
      const __m512 inv = _mm512_set1_ps(1.0f / step);
      int16_t* out = r.xq.data() + m * K + g * kGroup;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(a0, inv))));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16),
                          _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(a1, inv))));
      r.sx[m * G + g] = step;
    }
  }
  return r;
}

// Activation rows [m0, m0 + M) against tile t (weight rows 16t..16t+15); out has row stride N. C chains of
// vpdpwssd per row: a lone row would otherwise wait on each one's latency.
template <int M>
void tile_rows(const Int16Rows& xr, int64_t m0, const int8_t* q, const float* scale, float* out, int64_t K,
               int64_t N, int64_t t, const int8_t* q_end) {
  constexpr int C = M == 1 ? 4 : M <= 4 ? 2 : 1;
  const int64_t G = K / kGroup;
  const int8_t* wt = q + t * G * kGroupBytes;
  __m512 acc[M];
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const int8_t* wg = wt + g * kGroupBytes;
    const int8_t* ahead = wg + kPrefetchGroups * kGroupBytes;  // the weights stream in order
    if (ahead + kGroupBytes <= q_end) {
      for (int c = 0; c < 8; ++c) _mm_prefetch(reinterpret_cast<const char*>(ahead + 64 * c), _MM_HINT_T0);
    }
    __m512i s[C][M];
    for (int c = 0; c < C; ++c)
      for (int m = 0; m < M; ++m) s[c][m] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {  // half a group at a time: 8 weight registers
      __m512i w[8];
      for (int p = 0; p < 8; ++p) {
        w[p] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + (h * 8 + p) * 32)));
      }
      for (int m = 0; m < M; ++m) {
        const int32_t* x2 = reinterpret_cast<const int32_t*>(xr.xq.data() + (m0 + m) * K + g * kGroup + h * 16);
        for (int p = 0; p < 8; ++p) s[p % C][m] = _mm512_dpwssd_epi32(s[p % C][m], w[p], _mm512_set1_epi32(x2[p]));
      }
    }
    for (int m = 0; m < M; ++m) {
      __m512i sum = s[0][m];
      for (int c = 1; c < C; ++c) sum = _mm512_add_epi32(sum, s[c][m]);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(xr.sx[(m0 + m) * G + g]), acc[m]);
    }
  }
  const __m512 sc = _mm512_loadu_ps(scale + t * kTile);
  for (int m = 0; m < M; ++m) _mm512_storeu_ps(out + (m0 + m) * N + t * kTile, _mm512_mul_ps(acc[m], sc));
}

using TileFn = void (*)(const Int16Rows&, int64_t, const int8_t*, const float*, float*, int64_t, int64_t, int64_t,
                        const int8_t*);
constexpr TileFn kTileFns[kMaxRows + 1] = {nullptr, tile_rows<1>, tile_rows<2>, tile_rows<3>, tile_rows<4>,
                                           tile_rows<5>, tile_rows<6>, tile_rows<7>, tile_rows<8>};

void linear(const Int16Rows& xr, const int8_t* q, const float* scale, float* out, int64_t M, int64_t K, int64_t N,
            int64_t t0, int64_t t1) {
  const int8_t* q_end = q + N * K;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
      kTileFns[std::min<int64_t>(kMaxRows, M - m0)](xr, m0, q, scale, out, K, N, t, q_end);
    }
  }
}

}  // namespace vnni
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

// out[M, N] = (x @ q^T) * scale with qt the tiled q (see namespace vnni above): AVX512-VNNI only.
at::Tensor int8_linear_tiled(const at::Tensor& x, const at::Tensor& qt, const at::Tensor& scale) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "int8_linear_tiled: x float32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(qt.scalar_type() == at::kChar && qt.dim() == 3 && qt.size(1) * 2 == K && qt.size(2) == 32 &&
                  K % vnni::kGroup == 0 && qt.is_contiguous() && qt.device().is_cpu(),
              "int8_linear_tiled: qt int8 [N/16, K/2, 32] with K a multiple of 32");
  const int64_t N = qt.size(0) * vnni::kTile;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.dim() == 1 && scale.size(0) == N && scale.is_contiguous(),
              "int8_linear_tiled: scale float32 [N]");
  TORCH_CHECK(has_avx512() && __builtin_cpu_supports("avx512vnni"), "int8_linear_tiled: needs AVX512-VNNI");
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  const vnni::Int16Rows xr = vnni::quantize(xc.data_ptr<float>(), M, K);
  const int8_t* qp = qt.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N / vnni::kTile, 16, [&](int64_t t0, int64_t t1) { vnni::linear(xr, qp, sp, op, M, K, N, t0, t1); });
  return out;
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
  m.def("int8_linear_tiled(Tensor x, Tensor qt, Tensor scale) -> Tensor");
}
TORCH_LIBRARY_IMPL(homeai, CPU, m) {
  m.impl("int8_linear", &int8_linear);
  m.impl("int8_linear_avx2", &int8_linear_avx2);
  m.impl("int8_to_bf16", &int8_to_bf16);
  m.impl("int8_linear_tiled", &int8_linear_tiled);
}
