// int4 weight-only linear layer for the CPU, in Q4_1's layout: groups of 32 weights along K, each with a
// scale d and a minimum m (float16), w = q * d + m with q in 0..15 (homeai.runtime.quant.Int4Linear).
//
// Why a kernel of our own: a decode step reads every weight once, and torch's _weight_int4pack_mm_for_cpu
// streams 4-bit weights well below the machine's read bandwidth. On a CPU with AVX512-VNNI the activations
// are quantized to int8 per group of 32 (llama.cpp's Q4 x Q8) and one vpdpbusd multiplies 4 weights of 16
// rows at once: a fourth of the instructions of float32 activations, which matters from one row on (a
// 1-row step on a small CPU is bound by instructions) and most at 5-64 rows (decode batches, prompt chunks
// beside them), where float32 activations are compute-bound. For longer prompts ``int4_to_bf16`` writes a
// layer's weights as bfloat16 into a buffer reused by every layer, and the matmul runs in bfloat16 (AMX
// where the CPU has it).
//
// Layout, in tiles of 16 weight rows (N a multiple of 16): q is uint8 [N/16, K/32, 256]. A row's group
// holds 16 bytes in GGML's Q4_1 order (byte b: weight b in the low nibble, weight b + 16 in the high one),
// as four 32-bit words; a tile's group stores word c of its 16 rows side by side (64 bytes per c). So one
// 64-byte load holds 4 consecutive weights of 16 rows in its low nibbles (and the 4 at +16 in its high
// ones): what one vpdpbusd multiplies with 4 activations broadcast. sz is float16 [N/16, K/32, 32]: the 16
// rows' d, then their m (w = q d + m, exactly Q4_1's block header: a Q4_1 GGUF's weights are held without
// any loss). ``homeai.runtime.quant.tile_q4_1`` makes both from the row-major blocks.
// AVX-512 only (callers keep torch's packed int4 kernel elsewhere).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kTile = 16;        // weight rows per tile (one output register)
constexpr int64_t kTileBytes = 256;  // a tile's group: 16 rows x 16 bytes
constexpr int kMaxRows = 8;          // float32 activations: rows per pass over a block of weight rows
constexpr int kVnniMaxRows = 16;     // int8 activations: rows per pass over a tile (one accumulator each)
constexpr int64_t kBlockRows = 64;   // weight rows per block: stays in L2 across the passes
constexpr int64_t kQuantizeGrainRows = 16;  // fewer activation rows are quantized on the calling thread

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

// Row n's group g as 16 bytes in Q4_1's order, from the tiled layout (four words 64 bytes apart).
__attribute__((target("sse4.1"))) inline __m128i load_group(const uint8_t* q, int64_t n, int64_t g, int64_t G) {
  const int32_t* t = reinterpret_cast<const int32_t*>(q + ((n / kTile) * G + g) * kTileBytes) + n % kTile;
  return _mm_setr_epi32(t[0], t[16], t[32], t[48]);
}

// Row n's group g: its step d and minimum m.
inline void load_dm(const uint16_t* sz, int64_t n, int64_t g, int64_t G, float& d, float& m) {
  const uint16_t* t = sz + ((n / kTile) * G + g) * 2 * kTile + n % kTile;
  d = half_to_float(t[0]);
  m = half_to_float(t[kTile]);
}

}  // namespace

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma,f16c")
namespace {

// The 32 weights of one group as two float32 registers: q * d + m.
inline void dequant_group(const __m128i bytes, float s, float zb, __m512& w0, __m512& w1) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(bytes, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  const __m512 sv = _mm512_set1_ps(s), zv = _mm512_set1_ps(zb);
  w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), sv, zv);
  w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), sv, zv);
}

// float32 activations (a CPU without VNNI, or HOMEAI_INT4_VNNI=0): M activation rows (M <= kMaxRows)
// against weight rows [n0, n1), each group dequantized once and used for every activation row. ``out`` has
// row stride ``ldo``.
template <int M>
void rows_m(const float* x, const uint8_t* q, const uint16_t* sz, float* out, int64_t K, int64_t ldo,
            int64_t n0, int64_t n1) {
  const int64_t G = K / kGroup;
  for (int64_t n = n0; n < n1; ++n) {
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      float sc, zero;
      load_dm(sz, n, g, G, sc, zero);
      __m512 w0, w1;
      dequant_group(load_group(q, n, g, G), sc, zero, w0, w1);
      const int64_t k = g * kGroup;
      for (int m = 0; m < M; ++m) {
        acc[m] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + m * K + k), acc[m]);
        acc[m] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + m * K + k + 16), acc[m]);
      }
    }
    for (int m = 0; m < M; ++m) out[m * ldo + n] = _mm512_reduce_add_ps(acc[m]);
  }
}

using RowsFn = void (*)(const float*, const uint8_t*, const uint16_t*, float*, int64_t, int64_t, int64_t,
                        int64_t);
constexpr RowsFn kRowsFns[kMaxRows + 1] = {nullptr, rows_m<1>, rows_m<2>, rows_m<3>, rows_m<4>,
                                           rows_m<5>, rows_m<6>, rows_m<7>, rows_m<8>};

void linear(const float* x, const uint8_t* q, const uint16_t* sz, float* out, int64_t M, int64_t K, int64_t N,
            int64_t n0, int64_t n1) {
  for (int64_t nb = n0; nb < n1; nb += kBlockRows) {
    const int64_t ne = std::min(nb + kBlockRows, n1);
    for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, M - m0));
      kRowsFns[rows](x + m0 * K, q, sz, out + m0 * N, K, N, nb, ne);
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
  const int64_t G = K / kGroup;
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      float sc, zero;
      load_dm(sz, n, g, G, sc, zero);
      __m512 w0, w1;
      dequant_group(load_group(q, n, g, G), sc, zero, w0, w1);
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

// On a CPU with AVX512-VNNI, as llama.cpp computes its Q4 x Q8 dot products: each group of 32 activations
// is quantized to int8 with a scale of its own (sx), and per group
//   sum_k w_k x_k = d sx sum_k q_k xq_k + m sum_k x_k.
// One output register holds 16 weight rows (a tile): 8 vpdpbusd (4 nibbles of each of 16 rows times 4
// activations broadcast) give a group's integer sums, one convert and two FMAs scale them and add the
// minimum's term: 12 instructions per 512 multiply-adds and activation row, against 32 FMAs (and the
// weights' conversion to float) with float32 activations. A tile's nibbles are unpacked once for up to
// 16 activation rows (against 8: a 16-row step's matmuls 6 % faster, 46 rows 3 %).
struct QuantizedRows {
  std::vector<int8_t> xq;  // [M, K]
  std::vector<float> sx;   // [M, K / 32]: each group's scale
  std::vector<float> xs;   // [M, K / 32]: each group's sum of its quantized activations (times sx): with
                          // it the error is sum_k w_k e_k (w centred), with the exact sum sum_k q_k d e_k
};

// Rows [m0, m1) of x into r (sized for every row).
void quantize_rows(const float* x, int64_t K, int64_t m0, int64_t m1, QuantizedRows& r) {
  const int64_t G = K / kGroup;
  for (int64_t m = m0; m < m1; ++m) {
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
      r.sx[m * G + g] = scale;
      r.xs[m * G + g] = static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1))) * scale;
    }
  }
}

// Every row quantized, by all threads when there are enough rows to share (a prompt chunk: 5-8 % of its
// matmul's time on one thread), inline for a decode step's few.
QuantizedRows quantize_all_rows(const float* x, int64_t M, int64_t K) {
  const int64_t G = K / kGroup;
  QuantizedRows r{std::vector<int8_t>(M * K), std::vector<float>(M * G), std::vector<float>(M * G)};
  at::parallel_for(0, M, kQuantizeGrainRows, [&](int64_t m0, int64_t m1) { quantize_rows(x, K, m0, m1, r); });
  return r;
}

// Activation rows [m0, m0 + M) against tile t (weight rows 16t..16t+15); out has row stride N.
template <int M>
void tile_rows(const QuantizedRows& xr, int64_t m0, const uint8_t* q, const uint16_t* sz, float* out,
               int64_t K, int64_t N, int64_t t) {
  const int64_t G = K / kGroup;
  const uint8_t* wt = q + t * G * kTileBytes;
  const uint16_t* st = sz + t * G * 2 * kTile;
  const uint8_t* w_end = q + (N / kTile) * G * kTileBytes;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[M];
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* wg = wt + g * kTileBytes;
    const uint8_t* ahead = wg + 8 * kTileBytes;  // the weights stream in order: ask for them ahead
    if (ahead + kTileBytes <= w_end) {
      for (int c = 0; c < 4; ++c) _mm_prefetch(reinterpret_cast<const char*>(ahead + 64 * c), _MM_HINT_T0);
    }
    __m512i w[8];  // w[j]: weights 4j..4j+3 of the group, for each of the 16 rows
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_loadu_si512(wg + 64 * c);
      w[c] = _mm512_and_si512(v, low4);
      w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(st + g * 2 * kTile)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(st + g * 2 * kTile + kTile)));
    for (int m = 0; m < M; ++m) {
      const int64_t row = m0 + m;
      const int32_t* x4 = reinterpret_cast<const int32_t*>(xr.xq.data() + row * K + g * kGroup);
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();  // two chains: half the latency
      for (int j = 0; j < 8; j += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32(x4[j]));
        s1 = _mm512_dpbusd_epi32(s1, w[j + 1], _mm512_set1_epi32(x4[j + 1]));
      }
      const __m512 dots = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
      acc[m] = _mm512_fmadd_ps(dots, _mm512_mul_ps(d, _mm512_set1_ps(xr.sx[row * G + g])), acc[m]);
      acc[m] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xr.xs[row * G + g]), acc[m]);
    }
  }
  for (int m = 0; m < M; ++m) _mm512_storeu_ps(out + (m0 + m) * N + t * kTile, acc[m]);
}

using TileFn = void (*)(const QuantizedRows&, int64_t, const uint8_t*, const uint16_t*, float*, int64_t, int64_t,
                        int64_t);
constexpr TileFn kTileFns[kVnniMaxRows + 1] = {
    nullptr, tile_rows<1>, tile_rows<2>, tile_rows<3>, tile_rows<4>, tile_rows<5>, tile_rows<6>, tile_rows<7>,
    tile_rows<8>, tile_rows<9>, tile_rows<10>, tile_rows<11>, tile_rows<12>, tile_rows<13>, tile_rows<14>,
    tile_rows<15>, tile_rows<16>};

// Tiles [t0, t1), every activation row: up to 16 rows per pass over a tile (it stays in L1 between passes).
void linear_vnni(const QuantizedRows& xr, const uint8_t* q, const uint16_t* sz, float* out, int64_t M, int64_t K,
                 int64_t N, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t m0 = 0; m0 < M; m0 += kVnniMaxRows) {
      kTileFns[std::min<int64_t>(kVnniMaxRows, M - m0)](xr, m0, q, sz, out, K, N, t);
    }
  }
}

}  // namespace
#pragma GCC pop_options

namespace {

// N from the tiled q; checks that q and sz tile the same [N, K] weight.
int64_t check(const at::Tensor& q, const at::Tensor& sz, int64_t K) {
  TORCH_CHECK(q.scalar_type() == at::kByte && sz.scalar_type() == at::kHalf, "int4: q uint8, sz float16");
  TORCH_CHECK(K % kGroup == 0 && q.dim() == 3 && q.size(1) == K / kGroup && q.size(2) == kTileBytes,
              "int4: q [N/16, K/32, 256] with K a multiple of 32");
  TORCH_CHECK(sz.dim() == 3 && sz.size(0) == q.size(0) && sz.size(1) == K / kGroup && sz.size(2) == 2 * kTile,
              "int4: sz [N/16, K/32, 32]");
  TORCH_CHECK(q.device().is_cpu() && sz.device().is_cpu() && q.is_contiguous() && sz.is_contiguous(),
              "int4: contiguous CPU tensors");
  TORCH_CHECK(has_avx512(), "int4: needs AVX-512");
  return q.size(0) * kTile;
}

// int8_activations: the VNNI path where the CPU has it (else, or when false, float32 activations).
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& sz, bool int8_activations) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "int4_linear: x float32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t N = check(q, sz, K);
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  const float* xp = xc.data_ptr<float>();
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(sz.data_ptr<at::Half>());
  float* op = out.data_ptr<float>();
  if (int8_activations && has_vnni()) {
    const QuantizedRows xr = quantize_all_rows(xp, M, K);
    at::parallel_for(0, N / kTile, 4, [&](int64_t t0, int64_t t1) { linear_vnni(xr, qp, sp, op, M, K, N, t0, t1); });
    return out;
  }
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) { linear(xp, qp, sp, op, M, K, N, n0, n1); });
  return out;
}

void int4_to_bf16(at::Tensor& out, const at::Tensor& q, const at::Tensor& sz) {
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.dim() == 2 && out.is_contiguous() && out.device().is_cpu(),
              "int4_to_bf16: out contiguous bfloat16 [N, K]");
  const int64_t K = out.size(1);
  const int64_t N = check(q, sz, K);
  TORCH_CHECK(out.size(0) == N, "int4_to_bf16: out [N, K] for q [N/16, K/32, 256]");
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(sz.data_ptr<at::Half>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) { to_bf16(qp, sp, op, K, n0, n1); });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(homeai, m) {
  m.def("int4_linear(Tensor x, Tensor q, Tensor sz, bool int8_activations) -> Tensor");
  m.def("int4_to_bf16(Tensor(a!) out, Tensor q, Tensor sz) -> ()");
}
TORCH_LIBRARY_IMPL(homeai, CPU, m) {
  m.impl("int4_linear", &int4_linear);
  m.impl("int4_to_bf16", &int4_to_bf16);
}
