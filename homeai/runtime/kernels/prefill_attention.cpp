// Causal attention of one prompt chunk straight from the paged KV cache: n query rows at positions
// start .. start + n - 1, row i over the context's positions 0 .. start + i (the chunk's own keys and values
// are written to the cache before attention runs, as for decode rows).
//
// Why: a prompt's rows share their context, and both ways we had paid for that per row. The decode kernel
// (each prompt token a decode row) read and widened every key and value once per row and summed each
// query's dot products across lanes; SDPA's CPU kernel gathered and converted a copy of the context and is
// made for large query blocks. Here up to 16 query vectors (rows x query heads of one KV head) sit in the
// lanes of one register: a key position's score for all of them is D broadcast FMAs, a value position's
// contribution D more, the online softmax runs on all of them at once, and each key and value is widened
// once per block of rows. One layer, SmolLM2's 9 query and 3 KV heads of 64, float16 cache, 2-core EPYC
// (decode rows / SDPA -> this): 46 rows 61 / 175 -> 36 us, 100 rows 222 / 412 -> 102, 512 rows 5,316 /
// 5,576 -> 2,015, 256 rows after 1,000 cached positions 8,062 / 7,464 -> 4,336.
//
// With ``bf16_dots`` (a quantized model, whose prompts already round more: its weights lose far more than
// this) and a CPU with AVX512-BF16, queries, keys, values and softmax weights are rounded to bfloat16 and
// multiplied in pairs (vdpbf16ps: two products per lane, summed in float32), half the instructions of
// float32 FMAs; on a long context, where attention outweighs the matmuls, that is most of a chunk's time.
//
// Layout: kv [layers, slots, 2, kv_heads, d] (homeai.runtime.kv_cache), q [n, heads, d] with the query heads
// of KV head h at h * group .. h * group + group - 1 (GQA), slots [start + n]: the slot of each position.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,fma")
namespace {

#include "attention_math.inc"

constexpr int kLanes = 16;  // query vectors per block: one register's lanes
constexpr int kTile = 16;   // key positions per tile
constexpr int kChains = 8;  // score registers in flight: FMA latency is hidden across positions

// Lanes i of lo and hi as bfloat16 pairs (lo_i, hi_i): what one vdpbf16ps lane multiplies with a pair.
inline __m512bh pairs(__m512 lo, __m512 hi) {
  alignas(64) static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i halves = (__m512i)(_mm512_cvtne2ps_pbh(hi, lo));  // lo's 16, then hi's
  return (__m512bh)(_mm512_permutexvar_epi16(_mm512_load_si512(order), halves));
}

// 16 floats as one 32-bit broadcast of two bfloat16 at p: the pair a vdpbf16ps lane meets.
inline __m512bh broadcast_pair(const uint32_t* p) { return (__m512bh)(_mm512_set1_epi32(*p)); }

// One block: KV head h, rows [r0, r1) (with `group` query heads each, at most kLanes vectors in all).
// kBf16: the dot products in bfloat16 pairs (see the top of the file), else in float32.
template <int D, bool kBf16, typename T>
void block(const float* q, const T* kv_layer, const int64_t* slots, int64_t start, int64_t r0, int64_t r1,
           int64_t h, int64_t heads, int64_t kv_heads, int group, float scale, float* out) {
  const int64_t slot_stride = 2 * kv_heads * D;  // elements per slot: keys then values of every KV head
  const int lanes = static_cast<int>(r1 - r0) * group;
  alignas(64) float qt[D][kLanes];    // the block's queries, transposed and scaled: lane = (row, head)
  alignas(64) float acc[D][kLanes];   // their outputs, unnormalized, transposed the same way
  alignas(64) float kf[kTile][D];     // a tile's keys and values, widened to float32
  alignas(64) float vf[kTile][D];
  alignas(64) uint32_t qb[D / 2][kLanes];     // kBf16: each lane's query as pairs of dimensions
  alignas(64) uint32_t kb[kTile][D / 2];      // kBf16: a tile's keys as pairs of dimensions
  alignas(64) uint32_t vb[kTile / 2][D];      // kBf16: a tile's values, positions 2p and 2p + 1 paired
  alignas(64) int32_t pos[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    const bool used = l < lanes;
    const int64_t r = r0 + l / group;
    pos[l] = used ? static_cast<int32_t>(start + r) : -1;  // an unused lane sees no position
    const float* qv = q + (r * heads + h * group + l % group) * D;
    for (int d = 0; d < D; ++d) qt[d][l] = used ? qv[d] * scale : 0.f;
  }
  if constexpr (kBf16) {
    for (int d = 0; d < D; d += 2)
      _mm512_store_si512(qb[d / 2], (__m512i)(pairs(_mm512_load_ps(qt[d]), _mm512_load_ps(qt[d + 1]))));
  }
  for (int d = 0; d < D; ++d) _mm512_store_ps(acc[d], _mm512_setzero_ps());
  const __m512i lane_pos = _mm512_load_si512(pos);
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m = minus_inf, s = _mm512_setzero_ps();
  const int64_t end = start + r1;  // the block's last row sees positions up to end - 1
  for (int64_t t0 = 0; t0 < end; t0 += kTile) {
    const int n = static_cast<int>(std::min<int64_t>(kTile, end - t0));
    if constexpr (kBf16) {
      if (n < kTile) std::fill(&kb[n][0], &kb[0][0] + kTile * D / 2, 0u);  // past the context: scored, unused
      for (int j = 0; j < n; ++j) {
        const T* slot = kv_layer + slots[t0 + j] * slot_stride + h * D;
        for (int i = 0; i < D / 16; ++i)
          _mm256_store_si256(reinterpret_cast<__m256i*>(kb[j] + 8 * i),
                             (__m256i)(_mm512_cvtneps_pbh(load16(slot + 16 * i))));
      }
      for (int j = 0; j < n; j += 2) {
        const T* v0 = kv_layer + slots[t0 + j] * slot_stride + (kv_heads + h) * D;
        const T* v1 = j + 1 < n ? kv_layer + slots[t0 + j + 1] * slot_stride + (kv_heads + h) * D : nullptr;
        for (int i = 0; i < D / 16; ++i) {
          const __m512 odd = v1 != nullptr ? load16(v1 + 16 * i) : _mm512_setzero_ps();
          _mm512_store_si512(vb[j / 2] + 16 * i, (__m512i)(pairs(load16(v0 + 16 * i), odd)));
        }
      }
    } else {
      if (n < kTile) std::fill(&kf[n][0], &kf[0][0] + kTile * D, 0.f);  // rows past the context: scored, unused
      for (int j = 0; j < n; ++j) {
        const T* slot = kv_layer + slots[t0 + j] * slot_stride;
        for (int i = 0; i < D / 16; ++i) {
          _mm512_store_ps(kf[j] + 16 * i, load16(slot + h * D + 16 * i));
          _mm512_store_ps(vf[j] + 16 * i, load16(slot + (kv_heads + h) * D + 16 * i));
        }
      }
    }
    __m512 sc[kTile];
    for (int j0 = 0; j0 < n; j0 += kChains) {
      __m512 a[kChains];
      for (int c = 0; c < kChains; ++c) a[c] = _mm512_setzero_ps();
      if constexpr (kBf16) {
        for (int d = 0; d < D; d += 2) {
          const __m512bh qd = (__m512bh)(_mm512_load_si512(qb[d / 2]));
          for (int c = 0; c < kChains; ++c)
            a[c] = _mm512_dpbf16_ps(a[c], qd, broadcast_pair(kb[j0 + c] + d / 2));
        }
      } else {
        for (int d = 0; d < D; ++d) {
          const __m512 qd = _mm512_load_ps(qt[d]);
          for (int c = 0; c < kChains; ++c) a[c] = _mm512_fmadd_ps(qd, _mm512_set1_ps(kf[j0 + c][d]), a[c]);
        }
      }
      for (int c = 0; c < kChains && j0 + c < n; ++c) {
        const __mmask16 live = _mm512_cmp_epi32_mask(lane_pos, _mm512_set1_epi32(static_cast<int32_t>(t0 + j0 + c)),
                                                     _MM_CMPINT_NLT);
        sc[j0 + c] = _mm512_mask_mov_ps(minus_inf, live, a[c]);
      }
    }
    __m512 top = m;
    for (int j = 0; j < n; ++j) top = _mm512_max_ps(top, sc[j]);
    // A lane that has seen no position yet keeps -inf: its weights are then e^-inf = 0, not NaN.
    const __m512 safe = _mm512_mask_mov_ps(top, _mm512_cmp_ps_mask(top, minus_inf, _CMP_EQ_OQ), _mm512_setzero_ps());
    const __m512 rescale = exp_nonpositive(_mm512_sub_ps(m, safe));
    __m512 e[kTile];
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) {
      e[j] = exp_nonpositive(_mm512_sub_ps(sc[j], safe));
      sum = _mm512_add_ps(sum, e[j]);
    }
    s = _mm512_fmadd_ps(s, rescale, sum);
    m = top;
    if constexpr (kBf16) {
      __m512bh ep[kTile / 2];  // weights of positions 2p and 2p + 1, paired per lane
      for (int j = 0; j < n; j += 2) ep[j / 2] = pairs(e[j], j + 1 < n ? e[j + 1] : _mm512_setzero_ps());
      for (int d0 = 0; d0 < D; d0 += 8) {
        __m512 o[8];
        for (int i = 0; i < 8; ++i) o[i] = _mm512_mul_ps(_mm512_load_ps(acc[d0 + i]), rescale);
        for (int j = 0; j < n; j += 2)
          for (int i = 0; i < 8; ++i) o[i] = _mm512_dpbf16_ps(o[i], ep[j / 2], broadcast_pair(vb[j / 2] + d0 + i));
        for (int i = 0; i < 8; ++i) _mm512_store_ps(acc[d0 + i], o[i]);
      }
    } else {
      for (int d0 = 0; d0 < D; d0 += 8) {
        __m512 o[8];
        for (int i = 0; i < 8; ++i) o[i] = _mm512_mul_ps(_mm512_load_ps(acc[d0 + i]), rescale);
        for (int j = 0; j < n; ++j)
          for (int i = 0; i < 8; ++i) o[i] = _mm512_fmadd_ps(e[j], _mm512_set1_ps(vf[j][d0 + i]), o[i]);
        for (int i = 0; i < 8; ++i) _mm512_store_ps(acc[d0 + i], o[i]);
      }
    }
  }
  alignas(64) float inv[kLanes];
  _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.f), s));
  for (int l = 0; l < lanes; ++l) {
    float* o = out + ((r0 + l / group) * heads + h * group + l % group) * D;
    for (int d = 0; d < D; ++d) o[d] = acc[d][l] * inv[l];
  }
}

template <int D, bool kBf16, typename T>
void run(const float* q, const T* kv_layer, const int64_t* slots, int64_t start, int64_t n, int64_t heads,
         int64_t kv_heads, float* out) {
  const int group = static_cast<int>(heads / kv_heads);
  const int64_t rows = std::max(1, kLanes / group);  // rows per block
  const int64_t blocks = (n + rows - 1) / rows;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  // Later blocks see more positions, and each thread takes a contiguous range of tasks: in the order last,
  // first, second last, second, ... every range holds long and short blocks alike.
  at::parallel_for(0, blocks * kv_heads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t k = t / kv_heads, h = t % kv_heads;
      const int64_t b = k % 2 == 0 ? blocks - 1 - k / 2 : k / 2;
      block<D, kBf16>(q, kv_layer, slots, start, b * rows, std::min(n, (b + 1) * rows), h, heads, kv_heads,
                      group, scale, out);
    }
  });
}

}  // namespace
#pragma GCC pop_options

namespace {

bool has_avx512_bf16() {
  static const bool yes = __builtin_cpu_supports("avx512bf16");
  return yes;
}

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& kv, int64_t layer, const at::Tensor& slots,
                             int64_t start, bool bf16_dots) {
  TORCH_CHECK(q.dim() == 3 && kv.dim() == 5 && slots.dim() == 1,
              "prefill_attention: q [n, heads, d], kv [layers, slots, 2, kv_heads, d], slots [start + n]");
  TORCH_CHECK(q.scalar_type() == at::kFloat, "prefill_attention: float32 q");
  TORCH_CHECK(kv.scalar_type() == at::kFloat || kv.scalar_type() == at::kHalf || kv.scalar_type() == at::kBFloat16,
              "prefill_attention: a float32, float16 or bfloat16 cache");
  TORCH_CHECK(slots.scalar_type() == at::kLong, "prefill_attention: int64 slots");
  TORCH_CHECK(q.device().is_cpu() && kv.device().is_cpu(), "prefill_attention: CPU tensors");
  const int64_t n = q.size(0), heads = q.size(1), D = q.size(2), kv_heads = kv.size(3);
  TORCH_CHECK(kv.size(4) == D && kv.size(2) == 2 && heads % kv_heads == 0 && heads / kv_heads <= kLanes,
              "prefill_attention: head counts or head_dim do not match the cache");
  TORCH_CHECK(start >= 0 && slots.size(0) == start + n, "prefill_attention: slots [start + n]");
  TORCH_CHECK(0 <= layer && layer < kv.size(0), "prefill_attention: layer out of range");
  TORCH_CHECK(kv.is_contiguous(), "prefill_attention: a contiguous cache");
  TORCH_CHECK(D == 64 || D == 128, "prefill_attention: head_dim 64 or 128, got ", D);
  TORCH_CHECK(__builtin_cpu_supports("avx512f"), "prefill_attention: needs AVX-512");
  const at::Tensor qc = q.contiguous(), sc = slots.contiguous();
  at::Tensor out = at::empty_like(qc);
  if (n == 0) return out;
  const int64_t* sp = sc.data_ptr<int64_t>();
  for (int64_t l = 0; l < start + n; ++l)  // a slot outside the cache would read foreign memory: refuse it
    TORCH_CHECK(0 <= sp[l] && sp[l] < kv.size(1), "prefill_attention: slot ", sp[l], " of position ", l,
                " outside the cache's ", kv.size(1), " slots");
  const bool bf16 = bf16_dots && has_avx512_bf16();  // else float32, exact to its rounding
  with_cache_layer(kv, layer, [&](const auto* kv_layer) {
    const float* qp = qc.data_ptr<float>();
    float* op = out.data_ptr<float>();
    if (D == 64) {
      if (bf16) run<64, true>(qp, kv_layer, sp, start, n, heads, kv_heads, op);
      else run<64, false>(qp, kv_layer, sp, start, n, heads, kv_heads, op);
    } else {
      if (bf16) run<128, true>(qp, kv_layer, sp, start, n, heads, kv_heads, op);
      else run<128, false>(qp, kv_layer, sp, start, n, heads, kv_heads, op);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(homeai, m) {
  m.def("prefill_attention(Tensor q, Tensor kv, int layer, Tensor slots, int start, bool bf16_dots) -> Tensor");
}
TORCH_LIBRARY_IMPL(homeai, CPU, m) { m.impl("prefill_attention", &prefill_attention); }
