// int4 weight-only linear layer for the CPU, in Q4_1's layout: groups of 32 weights along K, each with a
// scale d and a minimum m (float16), w = q * d + m with q in 0..15 (homeai.runtime.quant.Int4Linear).
//
// Why a kernel of our own: a decode step reads every weight once, and torch's _weight_int4pack_mm_for_cpu
// streams 4-bit weights well below the machine's read bandwidth; this loop (float32 activations, software
// prefetch) reads them at the rate the int8 kernel reaches. For prompts, torch's int4 kernel is slower
// than float32 from ~40 rows on (1.7x at 512): ``int4_to_bf16`` writes a layer's weights as bfloat16 into a
// buffer that stays in cache, and the prompt's matmul runs in bfloat16 (AMX where the CPU has it).
//
// Layout: q is uint8 [N, K/2]; in each group's 16 bytes the low nibbles are weights 0..15 and the high
// nibbles weights 16..31 (as GGML's Q4_1 blocks). sz is float16 [N, K/32, 2]: (d, m) per group, w = q d + m,
// exactly Q4_1's block header: a Q4_1 GGUF's weights are held without any loss.
// AVX-512 only (callers keep torch's packed int4 kernel elsewhere).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr int kMaxRows = 8;          // activation rows per pass over a block of weight rows
constexpr int64_t kBlockRows = 64;   // weight rows per block: stays in L2 across the passes
constexpr int64_t kPrefetchRows = 8;

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
  return yes;
}

bool has_vnni() {
  static const bool yes = __builtin_cpu_supports("avx512vnni");
  return yes;
}

__attribute__((target("f16c"))) inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

}  // namespace

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma,f16c")
namespace {

// The 32 weights of one group as two float32 registers: q * d + m.
inline void dequant_group(const uint8_t* q16, float s, float zb, __m512& w0, __m512& w1) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q16));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  const __m512 sv = _mm512_set1_ps(s), zv = _mm512_set1_ps(zb);
  w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), sv, zv);
  w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), sv, zv);
}

// M activation rows (M <= kMaxRows) against weight rows [n0, n1): each group is dequantized once and used
// for every activation row. ``out`` has row stride ``ldo``.
template <int M>
void rows_m(const float* x, const uint8_t* q, const uint16_t* sz, float* out, int64_t K, int64_t ldo,
            int64_t n0, int64_t n1, const uint8_t* q_end) {
  const int64_t G = K / kGroup, row_bytes = K / 2;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* w = q + n * row_bytes;
    const uint16_t* s = sz + n * G * 2;
    const uint8_t* ahead = w + kPrefetchRows * row_bytes;
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      if ((g & 3) == 0 && ahead + g * 16 < q_end) _mm_prefetch(reinterpret_cast<const char*>(ahead + g * 16), _MM_HINT_T0);
      const float sc = half_to_float(s[2 * g]), zero = half_to_float(s[2 * g + 1]);
      __m512 w0, w1;
      dequant_group(w + g * 16, sc, zero, w0, w1);
      const int64_t k = g * kGroup;
      for (int m = 0; m < M; ++m) {
        acc[m] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + m * K + k), acc[m]);
        acc[m] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + m * K + k + 16), acc[m]);
      }
    }
    for (int m = 0; m < M; ++m) out[m * ldo + n] = _mm512_reduce_add_ps(acc[m]);
  }
}

// One activation row against weight rows [n0, n1), four at a time: eight independent FMA chains (a single
// chain per row would wait on the FMA latency, not on memory).
void rows_m1(const float* x, const uint8_t* q, const uint16_t* sz, float* out, int64_t K, int64_t n0,
             int64_t n1, const uint8_t* q_end) {
  const int64_t G = K / kGroup, row_bytes = K / 2;
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const uint8_t* w = q + n * row_bytes;
    const uint16_t* s = sz + n * G * 2;
    const uint8_t* ahead = w + kPrefetchRows * row_bytes;
    __m512 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      if ((g & 3) == 0) {
        for (int r = 0; r < 4; ++r) {
          const uint8_t* p = ahead + r * row_bytes + g * 16;
          if (p < q_end) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
        }
      }
      const __m512 x0 = _mm512_loadu_ps(x + g * kGroup), x1 = _mm512_loadu_ps(x + g * kGroup + 16);
      for (int r = 0; r < 4; ++r) {
        const uint16_t* sr = s + (r * G + g) * 2;
        const float sc = half_to_float(sr[0]), zero = half_to_float(sr[1]);
        __m512 w0, w1;
        dequant_group(w + r * row_bytes + g * 16, sc, zero, w0, w1);
        a[2 * r] = _mm512_fmadd_ps(w0, x0, a[2 * r]);
        a[2 * r + 1] = _mm512_fmadd_ps(w1, x1, a[2 * r + 1]);
      }
    }
    for (int r = 0; r < 4; ++r) out[n + r] = _mm512_reduce_add_ps(_mm512_add_ps(a[2 * r], a[2 * r + 1]));
  }
  if (n < n1) rows_m<1>(x, q, sz, out, K, 0, n, n1, q_end);
}

using RowsFn = void (*)(const float*, const uint8_t*, const uint16_t*, float*, int64_t, int64_t, int64_t,
                        int64_t, const uint8_t*);
constexpr RowsFn kRowsFns[kMaxRows + 1] = {nullptr, rows_m<1>, rows_m<2>, rows_m<3>, rows_m<4>,
                                           rows_m<5>, rows_m<6>, rows_m<7>, rows_m<8>};

void linear(const float* x, const uint8_t* q, const uint16_t* sz, float* out, int64_t M, int64_t K, int64_t N,
            int64_t n0, int64_t n1) {
  const uint8_t* q_end = q + N * K / 2;
  if (M == 1) {
    rows_m1(x, q, sz, out, K, n0, n1, q_end);
    return;
  }
  for (int64_t nb = n0; nb < n1; nb += kBlockRows) {
    const int64_t ne = std::min(nb + kBlockRows, n1);
    for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, M - m0));
      kRowsFns[rows](x + m0 * K, q, sz, out + m0 * N, K, N, nb, ne, q_end);
    }
  }
}

// 16 finite floats to bfloat16, rounded to nearest even (integer arithmetic: no AVX512-BF16 needed).
inline __m256i round_to_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

// Weight rows [n0, n1) as bfloat16 (round to nearest even) into ``out`` [N, K].
void to_bf16(const uint8_t* q, const uint16_t* sz, uint16_t* out, int64_t K, int64_t n0, int64_t n1) {
  const int64_t G = K / kGroup, row_bytes = K / 2;
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      const float sc = half_to_float(sz[(n * G + g) * 2]), zero = half_to_float(sz[(n * G + g) * 2 + 1]);
      __m512 w0, w1;
      dequant_group(q + n * row_bytes + g * 16, sc, zero, w0, w1);
      uint16_t* o = out + n * K + g * kGroup;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), round_to_bf16(w0));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16), round_to_bf16(w1));
    }
  }
}

}  // namespace
#pragma GCC pop_options


#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")
namespace {

// Decode-sized inputs on a CPU with AVX512-VNNI, as llama.cpp computes its Q4 x Q8 dot products: each group
// of 32 activations is quantized to int8 with a scale of its own (sx), and one vpdpbusd multiplies 64
// nibbles by 64 activations. Per group: sum_k w_k x_k = d sx sum_k q_k xq_k + m xs, with xs the
// group's dequantized activation sum. A third of the instructions of the float32 loop per weight, where a
// 1-row step on a small CPU is bound by instructions, not by memory.
constexpr int kVnniMaxRows = 4;

struct QuantizedRows {
  std::vector<int8_t> xq;   // [M, K]
  std::vector<float> sx;    // [M, K / 64, 16]: lanes 0-7 the first group's scale, 8-15 the second's
  std::vector<float> xs;    // [M, K / 64, 16]: each group's activation sum / 8, in its 8 lanes
};

QuantizedRows quantize_rows(const float* x, int64_t M, int64_t K) {
  const int64_t G = K / kGroup, P = K / 64;
  QuantizedRows r{std::vector<int8_t>(M * K), std::vector<float>(M * P * 16), std::vector<float>(M * P * 16)};
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < G; ++g) {
      const float* xg = x + m * K + g * kGroup;
      const __m512 a0 = _mm512_loadu_ps(xg), a1 = _mm512_loadu_ps(xg + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
      const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
      const __m512 inv = _mm512_set1_ps(1.0f / scale);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(a0, inv));  // round to nearest even
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(a1, inv));
      int8_t* out = r.xq.data() + m * K + g * kGroup;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_cvtsepi32_epi8(q1));
      const float sum = static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1))) * scale;
      float* sxp = r.sx.data() + (m * P + g / 2) * 16 + (g % 2) * 8;
      float* xsp = r.xs.data() + (m * P + g / 2) * 16 + (g % 2) * 8;
      for (int i = 0; i < 8; ++i) {
        sxp[i] = scale;
        xsp[i] = sum / 8.0f;
      }
    }
  }
  return r;
}

template <int M>
void rows_vnni(const QuantizedRows& xr, const uint8_t* q, const uint16_t* sz, float* out, int64_t K, int64_t ldo,
               int64_t n0, int64_t n1, const uint8_t* q_end) {
  const int64_t P = K / 64, row_bytes = K / 2;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m512i idx_s = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i idx_z = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* w = q + n * row_bytes;
    const uint16_t* s = sz + n * (K / kGroup) * 2;
    const uint8_t* ahead = w + kPrefetchRows * row_bytes;
    __m512 acc[M], acz[M];
    for (int m = 0; m < M; ++m) acc[m] = acz[m] = _mm512_setzero_ps();
    for (int64_t p = 0; p < P; ++p) {
      if ((p & 1) == 0 && ahead + p * 32 < q_end) _mm_prefetch(reinterpret_cast<const char*>(ahead + p * 32), _MM_HINT_T0);
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + p * 32));
      const __m256i lo = _mm256_and_si256(v, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);  // lo.0 lo.1 hi.0 hi.1
      const __m512i wq = _mm512_shuffle_i64x2(both, both, 0xD8);                  // lo.0 hi.0 lo.1 hi.1
      const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + p * 4));  // d0 m0 d1 m1
      const __m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(raw));
      const __m512 sw = _mm512_permutexvar_ps(idx_s, f);
      const __m512 zb = _mm512_permutexvar_ps(idx_z, f);
      for (int m = 0; m < M; ++m) {
        const __m512i xq = _mm512_loadu_si512(xr.xq.data() + m * K + p * 64);
        const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xq);
        const __m512 scale = _mm512_mul_ps(sw, _mm512_loadu_ps(xr.sx.data() + (m * P + p) * 16));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), scale, acc[m]);
        acz[m] = _mm512_fmadd_ps(zb, _mm512_loadu_ps(xr.xs.data() + (m * P + p) * 16), acz[m]);
      }
    }
    for (int m = 0; m < M; ++m) out[m * ldo + n] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m], acz[m]));
  }
}

using VnniFn = void (*)(const QuantizedRows&, const uint8_t*, const uint16_t*, float*, int64_t, int64_t, int64_t,
                        int64_t, const uint8_t*);
constexpr VnniFn kVnniFns[kVnniMaxRows + 1] = {nullptr, rows_vnni<1>, rows_vnni<2>, rows_vnni<3>, rows_vnni<4>};

}  // namespace
#pragma GCC pop_options

namespace {

void check(const at::Tensor& q, const at::Tensor& sz, int64_t K) {
  TORCH_CHECK(q.scalar_type() == at::kByte && sz.scalar_type() == at::kHalf, "int4: q uint8, sz float16");
  TORCH_CHECK(q.dim() == 2 && q.size(1) * 2 == K && K % kGroup == 0, "int4: q [N, K/2] with K a multiple of 32");
  TORCH_CHECK(sz.dim() == 3 && sz.size(0) == q.size(0) && sz.size(1) == K / kGroup && sz.size(2) == 2,
              "int4: sz [N, K/32, 2]");
  TORCH_CHECK(q.device().is_cpu() && sz.device().is_cpu() && q.is_contiguous() && sz.is_contiguous(),
              "int4: contiguous CPU tensors");
  TORCH_CHECK(has_avx512(), "int4: needs AVX-512");
}

// HOMEAI_INT4_VNNI=0 keeps float32 activations for every row count (the int8-activation path off).
bool vnni_enabled() {
  static const bool yes = [] {
    const char* v = std::getenv("HOMEAI_INT4_VNNI");
    return v == nullptr || std::string(v) != "0";
  }();
  return yes;
}

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& sz) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "int4_linear: x float32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  check(q, sz, K);
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  const float* xp = xc.data_ptr<float>();
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(sz.data_ptr<at::Half>());
  float* op = out.data_ptr<float>();
  if (M <= kVnniMaxRows && K % 64 == 0 && has_vnni() && vnni_enabled()) {
    const QuantizedRows xr = quantize_rows(xp, M, K);
    const uint8_t* q_end = qp + N * K / 2;
    at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
      kVnniFns[M](xr, qp, sp, op, K, N, n0, n1, q_end);
    });
    return out;
  }
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) { linear(xp, qp, sp, op, M, K, N, n0, n1); });
  return out;
}

void int4_to_bf16(at::Tensor& out, const at::Tensor& q, const at::Tensor& sz) {
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.dim() == 2 && out.is_contiguous() && out.device().is_cpu(),
              "int4_to_bf16: out contiguous bfloat16 [N, K]");
  const int64_t N = out.size(0), K = out.size(1);
  TORCH_CHECK(q.size(0) == N, "int4_to_bf16: out [N, K], q [N, K/2]");
  check(q, sz, K);
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(sz.data_ptr<at::Half>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) { to_bf16(qp, sp, op, K, n0, n1); });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(homeai, m) {
  m.def("int4_linear(Tensor x, Tensor q, Tensor sz) -> Tensor");
  m.def("int4_to_bf16(Tensor(a!) out, Tensor q, Tensor sz) -> ()");
}
TORCH_LIBRARY_IMPL(homeai, CPU, m) {
  m.impl("int4_linear", &int4_linear);
  m.impl("int4_to_bf16", &int4_to_bf16);
}
