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
#pragma GCC target("avx512f,avx512bw,avx512vl,fma")
namespace {

#include "attention_math.inc"

constexpr int kLanes = 16;  // query vectors per block: one register's lanes
constexpr int kTile = 16;   // key positions per tile
constexpr int kChains = 8;  // score registers in flight: FMA latency is hidden across positions

// One block: KV head h, rows [r0, r1) (with `group` query heads each, at most kLanes vectors in all).
template <int D, typename T>
void block(const float* q, const T* kv_layer, const int64_t* slots, int64_t start, int64_t r0, int64_t r1,
           int64_t h, int64_t heads, int64_t kv_heads, int group, float scale, float* out) {
  const int64_t slot_stride = 2 * kv_heads * D;  // elements per slot: keys then values of every KV head
  const int lanes = static_cast<int>(r1 - r0) * group;
  alignas(64) float qt[D][kLanes];    // the block's queries, transposed and scaled: lane = (row, head)
  alignas(64) float acc[D][kLanes];   // their outputs, unnormalized, transposed the same way
  alignas(64) float kf[kTile][D];     // a tile's keys and values, widened to float32
  alignas(64) float vf[kTile][D];
  alignas(64) int32_t pos[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    const bool used = l < lanes;
    const int64_t r = r0 + l / group;
    pos[l] = used ? static_cast<int32_t>(start + r) : -1;  // an unused lane sees no position
    const float* qv = q + (r * heads + h * group + l % group) * D;
    for (int d = 0; d < D; ++d) qt[d][l] = used ? qv[d] * scale : 0.f;
  }
  for (int d = 0; d < D; ++d) _mm512_store_ps(acc[d], _mm512_setzero_ps());
  const __m512i lane_pos = _mm512_load_si512(pos);
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m = minus_inf, s = _mm512_setzero_ps();
  const int64_t end = start + r1;  // the block's last row sees positions up to end - 1
  for (int64_t t0 = 0; t0 < end; t0 += kTile) {
    const int n = static_cast<int>(std::min<int64_t>(kTile, end - t0));
    if (n < kTile) std::fill(&kf[n][0], &kf[0][0] + kTile * D, 0.f);  // rows past the context: scored, unused
    for (int j = 0; j < n; ++j) {
      const T* slot = kv_layer + slots[t0 + j] * slot_stride;
      for (int i = 0; i < D / 16; ++i) {
        _mm512_store_ps(kf[j] + 16 * i, load16(slot + h * D + 16 * i));
        _mm512_store_ps(vf[j] + 16 * i, load16(slot + (kv_heads + h) * D + 16 * i));
      }
    }
    __m512 sc[kTile];
    for (int j0 = 0; j0 < n; j0 += kChains) {
      __m512 a[kChains];
      for (int c = 0; c < kChains; ++c) a[c] = _mm512_setzero_ps();
      for (int d = 0; d < D; ++d) {
        const __m512 qd = _mm512_load_ps(qt[d]);
        for (int c = 0; c < kChains; ++c) a[c] = _mm512_fmadd_ps(qd, _mm512_set1_ps(kf[j0 + c][d]), a[c]);
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
    for (int d0 = 0; d0 < D; d0 += 8) {
      __m512 o[8];
      for (int i = 0; i < 8; ++i) o[i] = _mm512_mul_ps(_mm512_load_ps(acc[d0 + i]), rescale);
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < 8; ++i) o[i] = _mm512_fmadd_ps(e[j], _mm512_set1_ps(vf[j][d0 + i]), o[i]);
      for (int i = 0; i < 8; ++i) _mm512_store_ps(acc[d0 + i], o[i]);
    }
  }
  alignas(64) float inv[kLanes];
  _mm512_store_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.f), s));
  for (int l = 0; l < lanes; ++l) {
    float* o = out + ((r0 + l / group) * heads + h * group + l % group) * D;
    for (int d = 0; d < D; ++d) o[d] = acc[d][l] * inv[l];
  }
}

template <int D, typename T>
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
      block<D>(q, kv_layer, slots, start, b * rows, std::min(n, (b + 1) * rows), h, heads, kv_heads, group,
               scale, out);
    }
  });
}

}  // namespace
#pragma GCC pop_options

namespace {

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& kv, int64_t layer, const at::Tensor& slots,
                             int64_t start) {
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
  with_cache_layer(kv, layer, [&](const auto* kv_layer) {
    if (D == 64) run<64>(qc.data_ptr<float>(), kv_layer, sp, start, n, heads, kv_heads, out.data_ptr<float>());
    else run<128>(qc.data_ptr<float>(), kv_layer, sp, start, n, heads, kv_heads, out.data_ptr<float>());
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(homeai, m) {
  m.def("prefill_attention(Tensor q, Tensor kv, int layer, Tensor slots, int start) -> Tensor");
}
TORCH_LIBRARY_IMPL(homeai, CPU, m) { m.impl("prefill_attention", &prefill_attention); }
