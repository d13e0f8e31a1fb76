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

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma")
namespace {

constexpr int kMaxGroup = 16;  // query heads per KV head

constexpr int64_t kAhead = 8;  // positions read ahead (software prefetch: the context is scattered in blocks)

// 16 cache elements as float32: float16 by the conversion instruction, bfloat16 by placing its bits high.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const at::BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

template <int D, typename T>
inline void prefetch(const T* row) {
  constexpr int per_line = 64 / sizeof(T);
  for (int i = 0; i < D; i += per_line) _mm_prefetch(reinterpret_cast<const char*>(row + i), _MM_HINT_T0);
}

// e^x for x <= 0 (scores minus their maximum), to float32 rounding: e^x = 2^n e^r with |r| <= ln2 / 2, e^r
// by its degree-6 Taylor polynomial (error below 2e-7 relative). Below -87 the result is 0, as expf's.
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 floor = _mm512_set1_ps(-87.f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, floor, _CMP_LT_OQ);
  x = _mm512_max_ps(x, floor);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2 in two parts: exact n*hi
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~tiny), p, n);
}

template <int D, typename T>
inline float dot(const float* a, const T* b) {
  __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(a), load16(b));
  for (int i = 16; i < D; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16(b + i), acc);
  return _mm512_reduce_add_ps(acc);
}

// One (sequence, KV head): scores of its query heads over the context, softmax, weighted sum of values.
template <int D, typename T>
void one_head(const float* q, const T* kv_layer, const int64_t* slots, int64_t len, int64_t kv_heads,
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

template <int D, typename T>
void run(const float* q, const T* kv_layer, const int64_t* slots, const int64_t* lens, float* out,
         int64_t B, int64_t L, int64_t heads, int64_t kv_heads) {
  const int group = static_cast<int>(heads / kv_heads);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, B * kv_heads, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> scores;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / kv_heads, h = t % kv_heads;
      const int64_t len = std::min(std::max<int64_t>(lens[b], 1), L);
      const int64_t head0 = b * heads + h * group;
      one_head<D>(q + head0 * D, kv_layer, slots + b * L, len, kv_heads, h, group, scale, out + head0 * D, scores);
    }
  });
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
  auto go = [&](auto* base) {
    const auto* kv_layer = base + layer * kv.stride(0);
    if (D == 64) run<64>(qc.data_ptr<float>(), kv_layer, sp, lp, out.data_ptr<float>(), B, L, heads, kv_heads);
    else run<128>(qc.data_ptr<float>(), kv_layer, sp, lp, out.data_ptr<float>(), B, L, heads, kv_heads);
  };
  switch (kv.scalar_type()) {
    case at::kHalf: go(kv.data_ptr<at::Half>()); break;
    case at::kBFloat16: go(kv.data_ptr<at::BFloat16>()); break;
    default: go(kv.data_ptr<float>());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(homeai, m) {
  m.def("decode_attention(Tensor q, Tensor kv, int layer, Tensor slots, Tensor lens) -> Tensor");
}
TORCH_LIBRARY_IMPL(homeai, CPU, m) { m.impl("decode_attention", &decode_attention); }
