// The elementwise work between an eager step's matmuls, one pass each: the residual add with the RMSNorm
// after it, RoPE in place on q and k, and SwiGLU's silu(gate) * up.
//
// Why: eager PyTorch spends some twenty ops a layer on this (rms_norm alone is pow, mean, add, rsqrt and
// two multiplies), each a dispatch, an allocation and an OpenMP fork/join. On the 2-core EPYC that was
// ~7 ms of a 36-token prompt step's 25 (the int4 matmuls took 14). Compiled decode steps get the same
// fusion from Inductor; eager steps (prompt chunks, mixed steps, steps above the largest bucket) get it
// here. float32, AVX-512; ``homeai.runtime.llama`` keeps torch's ops elsewhere.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,fma")
namespace {

constexpr int64_t kGrainElements = 1 << 14;  // below ~16k elements a fork/join costs more than it saves

inline int64_t grain_rows(int64_t row_elements) { return std::max<int64_t>(1, kGrainElements / row_elements); }

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// e^x: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor series to r^7 (error < 1e-8), times 2^n.
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Row t: x[t] += delta[t] (when given), then out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w.
void add_rms_norm_rows(float* x, const float* delta, const float* w, float* out, int64_t H, float eps, int64_t t0,
                       int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    float* xr = x + t * H;
    const float* dr = delta != nullptr ? delta + t * H : nullptr;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < H; i += 16) {
      const __mmask16 m = tail_mask(H - i);
      __m512 v = _mm512_maskz_loadu_ps(m, xr + i);
      if (dr != nullptr) {
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, dr + i));
        _mm512_mask_storeu_ps(xr + i, m, v);
      }
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(H) + eps));
    float* orow = out + t * H;
    for (int64_t i = 0; i < H; i += 16) {
      const __mmask16 m = tail_mask(H - i);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), inv);
      _mm512_mask_storeu_ps(orow + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
    }
  }
}

// Rows t0..t1 of [T, 2I] (gate | up) -> [T, I]: silu(gate) * up.
void silu_mul_rows(const float* gu, float* out, int64_t I, int64_t t0, int64_t t1) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const float* g = gu + t * 2 * I;
    const float* u = g + I;
    float* o = out + t * I;
    for (int64_t i = 0; i < I; i += 16) {
      const __mmask16 m = tail_mask(I - i);
      const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
      const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
      _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, u + i)));
    }
  }
}

// Rows t0..t1: the first ``heads`` heads of d values (pairs (2i, 2i + 1), the interleaved layout) of each row
// of ``x`` (row stride ``ld``) rotated by the angle table's (cos, sin) pairs at the row's position.
void rope_rows(float* x, int64_t ld, const int64_t* pos, const float* table, int64_t heads, int64_t d, int64_t t0,
               int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    const float* cs = table + pos[t] * d;  // d/2 pairs (cos, sin)
    float* row = x + t * ld;
    for (int64_t i = 0; i < d; i += 16) {
      const __m512 a = _mm512_loadu_ps(cs + i);
      const __m512 c = _mm512_moveldup_ps(a), s = _mm512_movehdup_ps(a);  // (c, c) and (s, s) per pair
      for (int64_t h = 0; h < heads; ++h) {
        float* p = row + h * d + i;
        const __m512 v = _mm512_loadu_ps(p);
        const __m512 swapped = _mm512_permute_ps(v, 0xB1);  // (im, re) per pair
        // even lanes re*c - im*s, odd lanes im*c + re*s
        _mm512_storeu_ps(p, _mm512_fmaddsub_ps(v, c, _mm512_mul_ps(swapped, s)));
      }
    }
  }
}

}  // namespace
#pragma GCC pop_options

namespace {

bool has_avx512() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"); }

void check_rows(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(), what,
              ": contiguous float32 CPU [T, H]");
}

// x += delta (in place, when delta is given), returns rms_norm(x) * w.
at::Tensor add_rms_norm(at::Tensor& x, const std::optional<at::Tensor>& delta, const at::Tensor& w, double eps) {
  TORCH_CHECK(has_avx512(), "add_rms_norm: needs AVX-512");
  check_rows(x, "add_rms_norm: x");
  const int64_t T = x.size(0), H = x.size(1);
  TORCH_CHECK(w.dim() == 1 && w.size(0) == H && w.scalar_type() == at::kFloat && w.is_contiguous(),
              "add_rms_norm: w float32 [H]");
  const float* dp = nullptr;
  if (delta.has_value()) {
    check_rows(*delta, "add_rms_norm: delta");
    TORCH_CHECK(delta->size(0) == T && delta->size(1) == H, "add_rms_norm: delta has x's shape");
    dp = delta->data_ptr<float>();
  }
  at::Tensor out = at::empty_like(x);
  float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, T, grain_rows(H), [&](int64_t t0, int64_t t1) { add_rms_norm_rows(xp, dp, wp, op, H, e, t0, t1); });
  return out;
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(has_avx512(), "silu_mul: needs AVX-512");
  check_rows(gate_up, "silu_mul: gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "silu_mul: gate_up [T, 2I]");
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  at::Tensor out = at::empty({T, I}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, grain_rows(2 * I), [&](int64_t t0, int64_t t1) { silu_mul_rows(gp, op, I, t0, t1); });
  return out;
}

// Rotates the first heads * d columns of each row of x ([T, C], rows contiguous) in place.
void rope_(at::Tensor& x, const at::Tensor& positions, const at::Tensor& table, int64_t heads) {
  TORCH_CHECK(has_avx512(), "rope_: needs AVX-512");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.stride(1) == 1 && x.device().is_cpu(),
              "rope_: x float32 CPU [T, C], rows contiguous");
  TORCH_CHECK(table.dim() == 3 && table.size(2) == 2 && table.scalar_type() == at::kFloat && table.is_contiguous(),
              "rope_: table float32 [positions, d/2, 2]");
  const int64_t T = x.size(0), d = 2 * table.size(1);
  TORCH_CHECK(d % 16 == 0 && heads * d <= x.size(1), "rope_: d a multiple of 16, heads * d <= C");
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == T && positions.scalar_type() == at::kLong &&
                  positions.is_contiguous(),
              "rope_: positions int64 [T]");
  const int64_t* pp = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(pp[t] >= 0 && pp[t] < table.size(0), "rope_: position out of the table");
  float* xp = x.data_ptr<float>();
  const float* tp = table.data_ptr<float>();
  const int64_t ld = x.stride(0);
  at::parallel_for(0, T, grain_rows(heads * d), [&](int64_t t0, int64_t t1) { rope_rows(xp, ld, pp, tp, heads, d, t0, t1); });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(homeai, m) {
  m.def("add_rms_norm(Tensor(a!) x, Tensor? delta, Tensor w, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("rope_(Tensor(a!) x, Tensor positions, Tensor table, int heads) -> ()");
}
TORCH_LIBRARY_IMPL(homeai, CPU, m) {
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("silu_mul", &silu_mul);
  m.impl("rope_", &rope_);
}
