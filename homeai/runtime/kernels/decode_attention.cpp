// Decode attention straight from the paged KV cache: one query token per sequence, its context's keys
// and values read where they lie (no gather into a contiguous copy first).
//
// Why: the torch path copies each row's context out of the cache ([B, L, 2, kv_heads, d] per layer)
// and hands the copy to SDPA: the context crosses memory three times. At 32 streams of ~150 tokens
// that copy and SDPA were ~25 ms of a 67 ms step on the 2-core Xeon this was measured on; reading the
// cache once is what the step has to pay.
//
// Layout: kv [layers, slots, 2, kv_heads, d] (homeai.runtime.kv_cache), q [B, heads, d] with the query
// heads of KV head h at h * group .. h * group + group - 1 (GQA), slots [B, L] (padded), lens [B].
//
// The cache holds float32, float16 or bfloat16; arithmetic is float32 either way. A long context is what
// a decode row pays for (12 rows at 1,700 tokens read 940 MB of float32 keys and values per step against
// ~100 MB of int4 weights), so a 16-bit cache halves the cost of every long-context row.
//
// One pass per row (``row_span``) reads each slot whole, with an online softmax, and long rows are cut into
// spans so that one stream at a long context uses every thread. Measured on the 2-core Xeon (SmolLM2's
// 30 layers, float16 cache): 12 rows at 1,700 tokens 37.7 -> 31 ms, 16 rows at 200 6.5 -> 5.2 ms, one row
// at 1,700 4.8 -> 2.5 ms against one task per (row, KV head) in two passes; that is ~15 GB/s of the ~22 a
// plain streaming read gets here: the cache, not the arithmetic, bounds it now.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma")
namespace {

constexpr int kMaxGroup = 16;  // query heads per KV head

constexpr int64_t kAhead = 8;  // positions read ahead (software prefetch: the context is scattered in blocks)

#include "attention_math.inc"

template <int D, typename T>
inline float dot(const float* a, const T* b) {
  __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(a), load16(b));
  for (int i = 16; i < D; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16(b + i), acc);
  return _mm512_reduce_add_ps(acc);
}

// One (sequence, KV head) for any number of query heads per KV head (a runtime count: accumulators in
// memory), two passes (scores, then values). Float32 and float16 caches with 1-4 or 8 take ``row_span``.
template <int D, typename T>
void one_head_any(const float* q, const T* kv_layer, const int64_t* slots, int64_t len, int64_t kv_heads,
              int64_t h, int group, float scale, float* out, std::vector<float>& scores) {
  const int64_t slot_stride = 2 * kv_heads * D;  // elements per slot: keys then values of every KV head
  scores.resize(static_cast<size_t>(group) * len);
  float top[kMaxGroup];
  std::fill(top, top + group, -std::numeric_limits<float>::infinity());
  for (int64_t l = 0; l < len; ++l) {
    if (l + kAhead < len) prefetch<D>(kv_layer + slots[l + kAhead] * slot_stride + h * D);
    const T* k = kv_layer + slots[l] * slot_stride + h * D;
    for (int g = 0; g < group; ++g) {
      const float s = dot<D>(q + g * D, k) * scale;
      scores[g * len + l] = s;
      top[g] = std::max(top[g], s);
    }
  }
  float total[kMaxGroup];
  for (int g = 0; g < group; ++g) {
    float* s = scores.data() + g * len;
    const __m512 m = _mm512_set1_ps(top[g]);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t l = 0; l < len; l += 16) {
      const __mmask16 live = len - l >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (len - l)) - 1);
      const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + l), m));
      _mm512_mask_storeu_ps(s + l, live, e);
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(live, e));
    }
    total[g] = _mm512_reduce_add_ps(sum);
  }
  __m512 acc[kMaxGroup][D / 16];
  for (int g = 0; g < group; ++g)
    for (int i = 0; i < D / 16; ++i) acc[g][i] = _mm512_setzero_ps();
  for (int64_t l = 0; l < len; ++l) {
    if (l + kAhead < len) prefetch<D>(kv_layer + slots[l + kAhead] * slot_stride + (kv_heads + h) * D);
    const T* v = kv_layer + slots[l] * slot_stride + (kv_heads + h) * D;
    __m512 vv[D / 16];
    for (int i = 0; i < D / 16; ++i) vv[i] = load16(v + 16 * i);
    for (int g = 0; g < group; ++g) {
      const __m512 p = _mm512_set1_ps(scores[g * len + l]);
      for (int i = 0; i < D / 16; ++i) acc[g][i] = _mm512_fmadd_ps(p, vv[i], acc[g][i]);
    }
  }
  for (int g = 0; g < group; ++g) {
    const __m512 inv = _mm512_set1_ps(1.f / total[g]);
    for (int i = 0; i < D / 16; ++i) _mm512_storeu_ps(out + g * D + 16 * i, _mm512_mul_ps(acc[g][i], inv));
  }
}

// Per 128-bit lane L: [lane-L sum of a0, of a1, of a2, of a3].
inline __m512 lane_sums4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512d d0 = _mm512_castps_pd(t0), d1 = _mm512_castps_pd(t1);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)), _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));
}

// Lane j: the sum of a[j]'s 16 lanes. Sixteen dot products end in 30 shuffles and 15 adds, against 16 full
// horizontal sums (64 shuffles, 64 adds) when each is reduced on its own.
inline __m512 sums16(const __m512* a) {
  const __m512 r0 = lane_sums4(a[0], a[1], a[2], a[3]), r1 = lane_sums4(a[4], a[5], a[6], a[7]);
  const __m512 r2 = lane_sums4(a[8], a[9], a[10], a[11]), r3 = lane_sums4(a[12], a[13], a[14], a[15]);
  constexpr int kEven = _MM_SHUFFLE(2, 0, 2, 0), kOdd = _MM_SHUFFLE(3, 1, 3, 1);
  const __m512 y01 = _mm512_add_ps(_mm512_shuffle_f32x4(r0, r1, kEven), _mm512_shuffle_f32x4(r0, r1, kOdd));
  const __m512 y23 = _mm512_add_ps(_mm512_shuffle_f32x4(r2, r3, kEven), _mm512_shuffle_f32x4(r2, r3, kOdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(y01, y23, kEven), _mm512_shuffle_f32x4(y01, y23, kOdd));
}

// A span [l0, l1) of one row's context for every query head of the row, in one pass over the cache: each
// 16-position tile's slots are read whole (every KV head's keys and values lie side by side in a slot, and
// the 16 slots of a block are contiguous), so the context streams through memory once. Per tile and KV
// head: the keys are widened once into a float32 tile in L1, each query head's 16 dot products are summed
// together (``sums16``), the running maximum and sum are updated (online softmax), and the values are
// added, weighted, into the query heads' accumulators. Leaves the span's maximum m, sum s and unnormalized
// acc per query head (spans of a row are merged by ``merge_spans``).
template <int D, int G, typename T>
void row_span(const float* q, const T* kv_layer, const int64_t* slots, int64_t l0, int64_t l1, int64_t kv_heads,
              float scale, float* m, float* s, float* acc) {
  const int64_t slot_stride = 2 * kv_heads * D;  // elements per slot: keys then values of every KV head
  constexpr int64_t kLine = 64 / sizeof(T);
  const int heads = static_cast<int>(kv_heads) * G;
  std::fill(m, m + heads, -std::numeric_limits<float>::infinity());
  std::fill(s, s + heads, 0.f);
  std::fill(acc, acc + static_cast<int64_t>(heads) * D, 0.f);
  alignas(64) float tile[16 * D];
  alignas(64) float weight[G][16];
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t t0 = l0; t0 < l1; t0 += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, l1 - t0));
    for (int j = 0; j < 16 && t0 + 16 + j < l1; ++j) {  // the next tile, whole slots
      const char* next = reinterpret_cast<const char*>(kv_layer + slots[t0 + 16 + j] * slot_stride);
      for (int64_t e = 0; e < slot_stride; e += kLine) _mm_prefetch(next + e * sizeof(T), _MM_HINT_T0);
    }
    const __mmask16 live = n == 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
    if (n < 16) std::fill(tile + n * D, tile + 16 * D, 0.f);
    for (int64_t h = 0; h < kv_heads; ++h) {
      for (int j = 0; j < n; ++j) {
        const T* k = kv_layer + slots[t0 + j] * slot_stride + h * D;
        for (int i = 0; i < D / 16; ++i) _mm512_store_ps(tile + j * D + 16 * i, load16(k + 16 * i));
      }
      float rescale[G];
      for (int g = 0; g < G; ++g) {
        const float* qg = q + (h * G + g) * D;
        __m512 a[16];
        for (int j = 0; j < 16; ++j) {
          a[j] = _mm512_mul_ps(_mm512_loadu_ps(qg), _mm512_load_ps(tile + j * D));
          for (int i = 1; i < D / 16; ++i)
            a[j] = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * i), _mm512_load_ps(tile + j * D + 16 * i), a[j]);
        }
        const __m512 sc = _mm512_mask_mov_ps(minus_inf, live, _mm512_mul_ps(sums16(a), vscale));
        const int qh = static_cast<int>(h) * G + g;
        const float top = std::max(m[qh], _mm512_reduce_max_ps(sc));
        rescale[g] = std::exp(m[qh] - top);  // 0 on the first tile (m = -inf)
        const __m512 e = _mm512_maskz_mov_ps(live, exp_nonpositive(_mm512_sub_ps(sc, _mm512_set1_ps(top))));
        _mm512_store_ps(weight[g], e);
        s[qh] = s[qh] * rescale[g] + _mm512_reduce_add_ps(e);
        m[qh] = top;
      }
      float* acc_h = acc + h * G * D;
      __m512 sum[G][D / 16];
      for (int g = 0; g < G; ++g) {
        const __m512 r = _mm512_set1_ps(rescale[g]);
        for (int i = 0; i < D / 16; ++i) sum[g][i] = _mm512_mul_ps(_mm512_loadu_ps(acc_h + g * D + 16 * i), r);
      }
      for (int j = 0; j < n; ++j) {
        const T* v = kv_layer + slots[t0 + j] * slot_stride + (kv_heads + h) * D;
        __m512 vv[D / 16];
        for (int i = 0; i < D / 16; ++i) vv[i] = load16(v + 16 * i);
        for (int g = 0; g < G; ++g) {
          const __m512 w = _mm512_set1_ps(weight[g][j]);
          for (int i = 0; i < D / 16; ++i) sum[g][i] = _mm512_fmadd_ps(w, vv[i], sum[g][i]);
        }
      }
      for (int g = 0; g < G; ++g)
        for (int i = 0; i < D / 16; ++i) _mm512_storeu_ps(acc_h + g * D + 16 * i, sum[g][i]);
    }
  }
}

// out[head] = sum over spans of acc e^(m - M) / sum over spans of s e^(m - M), M the largest m: the
// softmax over the whole context, from its spans' partial results.
template <int D>
void merge_spans(const float* m, const float* s, const float* acc, int64_t spans, int heads, float* out) {
  for (int hd = 0; hd < heads; ++hd) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < spans; ++c) top = std::max(top, m[c * heads + hd]);
    __m512 o[D / 16];
    for (int i = 0; i < D / 16; ++i) o[i] = _mm512_setzero_ps();
    float total = 0.f;
    for (int64_t c = 0; c < spans; ++c) {
      const float w = std::exp(m[c * heads + hd] - top);
      total += s[c * heads + hd] * w;
      const float* a = acc + (c * heads + hd) * D;
      for (int i = 0; i < D / 16; ++i) o[i] = _mm512_fmadd_ps(_mm512_set1_ps(w), _mm512_loadu_ps(a + 16 * i), o[i]);
    }
    const __m512 inv = _mm512_set1_ps(1.f / total);
    for (int i = 0; i < D / 16; ++i) _mm512_storeu_ps(out + hd * D + 16 * i, _mm512_mul_ps(o[i], inv));
  }
}

// Rows cut into spans of at least kMinSpan positions, enough spans for every thread: a few long rows (one
// stream at a long context) still use every core. 64, not 256: one stream's row at 50-650 tokens had one
// thread doing most of it (SmolLM2 int4, a compiled one-row step on a 2-core EPYC, two runs each: 5.74 /
// 6.05 -> 5.32 / 5.09 ms at 50-250 tokens, 7.15 / 8.00 -> 6.56 / 5.76 at 450-650); a span's merge is a few
// hundred floats.
constexpr int64_t kMinSpan = 64;

template <int D, int G, typename T>
void run_spans(const float* q, const T* kv_layer, const int64_t* slots, const int64_t* lens, float* out,
               int64_t B, int64_t L, int64_t kv_heads) {
  const int heads = static_cast<int>(kv_heads) * G;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  int64_t total = 0;
  for (int64_t b = 0; b < B; ++b) total += std::min(std::max<int64_t>(lens[b], 1), L);
  const int64_t want = 2 * static_cast<int64_t>(at::get_num_threads());
  int64_t span = std::max(kMinSpan, (total + want - 1) / want);
  span = (span + 15) & ~int64_t{15};  // whole tiles: a span starts where a KV block does
  std::vector<int64_t> first(B + 1, 0);  // spans of row b: first[b] .. first[b + 1] - 1
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = std::min(std::max<int64_t>(lens[b], 1), L);
    first[b + 1] = first[b] + (len + span - 1) / span;
  }
  const int64_t spans = first[B];
  std::vector<float> m(spans * heads), s(spans * heads), acc(spans * heads * D);
  at::parallel_for(0, spans, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t b = std::upper_bound(first.begin(), first.end(), c) - first.begin() - 1;
      const int64_t len = std::min(std::max<int64_t>(lens[b], 1), L);
      const int64_t l0 = (c - first[b]) * span, l1 = std::min(len, l0 + span);
      row_span<D, G>(q + b * heads * D, kv_layer, slots + b * L, l0, l1, kv_heads, scale, m.data() + c * heads,
                     s.data() + c * heads, acc.data() + c * heads * D);
    }
  });
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      merge_spans<D>(m.data() + first[b] * heads, s.data() + first[b] * heads, acc.data() + first[b] * heads * D,
                     first[b + 1] - first[b], heads, out + b * heads * D);
  });
}

template <int D, typename T>
void run_any(const float* q, const T* kv_layer, const int64_t* slots, const int64_t* lens, float* out,
             int64_t B, int64_t L, int64_t heads, int64_t kv_heads) {
  const int group = static_cast<int>(heads / kv_heads);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, B * kv_heads, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> scores;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / kv_heads, h = t % kv_heads;
      const int64_t len = std::min(std::max<int64_t>(lens[b], 1), L);
      const int64_t head0 = b * heads + h * group;
      one_head_any<D>(q + head0 * D, kv_layer, slots + b * L, len, kv_heads, h, group, scale, out + head0 * D,
                      scores);
    }
  });
}

template <int D, typename T>
void run(const float* q, const T* kv_layer, const int64_t* slots, const int64_t* lens, float* out,
         int64_t B, int64_t L, int64_t heads, int64_t kv_heads) {
  // The one-pass kernel is compiled for the caches served (float32 weights' float32, quantized weights'
  // float16) and the usual query heads per KV head (1-4, 8: SmolLM2 3, Llama 3 4); each instance costs
  // seconds of the first build. Anything else (a bfloat16 cache, other groups) takes the two-pass kernel.
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, at::Half>) {
    switch (heads / kv_heads) {
      case 1: run_spans<D, 1>(q, kv_layer, slots, lens, out, B, L, kv_heads); return;
      case 2: run_spans<D, 2>(q, kv_layer, slots, lens, out, B, L, kv_heads); return;
      case 3: run_spans<D, 3>(q, kv_layer, slots, lens, out, B, L, kv_heads); return;
      case 4: run_spans<D, 4>(q, kv_layer, slots, lens, out, B, L, kv_heads); return;
      case 8: run_spans<D, 8>(q, kv_layer, slots, lens, out, B, L, kv_heads); return;
      default: break;
    }
  }
  run_any<D>(q, kv_layer, slots, lens, out, B, L, heads, kv_heads);
}

}  // namespace
#pragma GCC pop_options

namespace {

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& kv, int64_t layer, const at::Tensor& slots,
                            const at::Tensor& lens) {
  TORCH_CHECK(q.dim() == 3 && kv.dim() == 5 && slots.dim() == 2 && lens.dim() == 1,
              "decode_attention: q [B, heads, d], kv [layers, slots, 2, kv_heads, d], slots [B, L], lens [B]");
  TORCH_CHECK(q.scalar_type() == at::kFloat, "decode_attention: float32 q");
  TORCH_CHECK(kv.scalar_type() == at::kFloat || kv.scalar_type() == at::kHalf || kv.scalar_type() == at::kBFloat16,
              "decode_attention: a float32, float16 or bfloat16 cache");
  TORCH_CHECK(slots.scalar_type() == at::kLong && lens.scalar_type() == at::kLong, "decode_attention: int64 slots, lens");
  TORCH_CHECK(q.device().is_cpu() && kv.device().is_cpu(), "decode_attention: CPU tensors");
  const int64_t B = q.size(0), heads = q.size(1), D = q.size(2), kv_heads = kv.size(3);
  TORCH_CHECK(kv.size(4) == D && kv.size(2) == 2 && heads % kv_heads == 0 && heads / kv_heads <= kMaxGroup,
              "decode_attention: head counts or head_dim do not match the cache");
  TORCH_CHECK(slots.size(0) == B && lens.size(0) == B && slots.size(1) >= 1, "decode_attention: slots [B, L], lens [B]");
  TORCH_CHECK(0 <= layer && layer < kv.size(0), "decode_attention: layer out of range");
  TORCH_CHECK(kv.is_contiguous(), "decode_attention: a contiguous cache");
  TORCH_CHECK(__builtin_cpu_supports("avx512f"), "decode_attention: needs AVX-512");
  const at::Tensor qc = q.contiguous(), sc = slots.contiguous(), lc = lens.contiguous();
  at::Tensor out = at::empty_like(qc);
  const int64_t L = sc.size(1), num_slots = kv.size(1);
  const int64_t* sp = sc.data_ptr<int64_t>();
  const int64_t* lp = lc.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {  // a slot outside the cache would read foreign memory: refuse it
    const int64_t len = std::min(std::max<int64_t>(lp[b], 1), L);
    for (int64_t l = 0; l < len; ++l)
      TORCH_CHECK(0 <= sp[b * L + l] && sp[b * L + l] < num_slots, "decode_attention: slot ", sp[b * L + l],
                  " of row ", b, " outside the cache's ", num_slots, " slots");
  }
  TORCH_CHECK(D == 64 || D == 128, "decode_attention: head_dim 64 or 128, got ", D);
  with_cache_layer(kv, layer, [&](const auto* kv_layer) {
    if (D == 64) run<64>(qc.data_ptr<float>(), kv_layer, sp, lp, out.data_ptr<float>(), B, L, heads, kv_heads);
    else run<128>(qc.data_ptr<float>(), kv_layer, sp, lp, out.data_ptr<float>(), B, L, heads, kv_heads);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(homeai, m) {
  m.def("decode_attention(Tensor q, Tensor kv, int layer, Tensor slots, Tensor lens) -> Tensor");
}
TORCH_LIBRARY_IMPL(homeai, CPU, m) { m.impl("decode_attention", &decode_attention); }
