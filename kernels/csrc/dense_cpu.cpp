// torch.ops.kvbench_dense: the element-wise work between a Llama layer's GEMMs, fused for a CPU.
//
// Eager torch runs a decode step's norms, RoPE and SwiGLU as ~25 small ops a layer, each a
// dispatch, an allocation and a pass over memory; at decode sizes (a few rows of a few hundred
// floats) the calls cost more than the arithmetic. A CPU serving engine runs each as one loop;
// so do these. They work on contiguous float32 rows and are built with -ffp-contract=off, so
// a product and a sum round as torch's separate ops round them:
//
//   rms_norm       y = w * (x * rsqrt(mean(x^2) + eps))            HF's LlamaRMSNorm in fp32
//   add_rms_norm   s = h + d; y = rms_norm(s)                      the residual add before a norm
//   rope_qkv       the fused q/k/v projection's output split into dense q, k, v, q and k rotated
//                  by RoPE (rotate-half pairs (i, i + D/2)): bit-identical to harness/model/rope.py
//   silu_mul       silu(gate) * up over the fused gate/up projection's [T, 2I] output
//   argmax_rows    each row's greedy token, as torch.argmax (bit-exact: a comparison rounds nothing)
//
// Two differ from torch in the last bits: the mean's sum runs in 16 partial sums (torch's
// vectorized reduction has an order of its own), and silu's exp is a Cephes-style polynomial
// (torch's is SLEEF's), each within 2 ulp. The model's tests bound the difference and check
// that greedy tokens are unchanged (tests/unit/harness/model/test_llama_fused.py).

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>

#include "cpu_isa.h"

namespace {

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, "kvbench_dense: ", name,
              " must be a float32 CPU tensor, got ", t.scalar_type(), " on ", t.device());
  TORCH_CHECK(t.is_contiguous(), "kvbench_dense: ", name, " must be contiguous");
}

constexpr int kLanes = 16;  // partial sums: independent, so the compiler vectorizes the loop

inline float sum_squares(const float* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * x[i + j];
  float total = 0.f;
  for (int j = 0; j < kLanes; ++j) total += acc[j];
  for (; i < n; ++i) total += x[i] * x[i];
  return total;
}

inline void norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  float var = sum_squares(x, n) / static_cast<float>(n);
  var += eps;
  const float r = 1.f / std::sqrt(var);  // torch's rsqrt on a CPU: 1 / sqrt, both IEEE-rounded
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * r);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_rows(x, "x");
  check_rows(w, "w");
  const int64_t n = x.size(-1);
  TORCH_CHECK(w.numel() == n, "kvbench_dense::rms_norm: weight has ", w.numel(), " elements, rows have ", n);
  const int64_t rows = n ? x.numel() / n : 0;
  at::Tensor y = at::empty(x.sizes(), x.options());
  const float* xp = x.const_data_ptr<float>();
  const float* wp = w.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) norm_row(xp + r * n, wp, yp + r * n, n, static_cast<float>(eps));
  return y;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& h, const at::Tensor& d, const at::Tensor& w,
                                                double eps) {
  check_rows(h, "h");
  check_rows(d, "d");
  check_rows(w, "w");
  TORCH_CHECK(h.sizes() == d.sizes(), "kvbench_dense::add_rms_norm: h ", h.sizes(), " and d ", d.sizes(),
              " differ in shape");
  const int64_t n = h.size(-1);
  TORCH_CHECK(w.numel() == n, "kvbench_dense::add_rms_norm: weight has ", w.numel(), " elements, rows have ", n);
  const int64_t rows = n ? h.numel() / n : 0;
  at::Tensor s = at::empty(h.sizes(), h.options());
  at::Tensor y = at::empty(h.sizes(), h.options());
  const float* hp = h.const_data_ptr<float>();
  const float* dp = d.const_data_ptr<float>();
  const float* wp = w.const_data_ptr<float>();
  float* sp = s.mutable_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r * n;
    for (int64_t i = 0; i < n; ++i) sp[o + i] = hp[o + i] + dp[o + i];
    norm_row(sp + o, wp, yp + o, n, static_cast<float>(eps));
  }
  return {s, y};
}

// x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[D/2:], x[:D/2]): each product rounded, then the sum.
inline void rope_head(const float* x, const float* c, const float* s, float* o, int64_t dim) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i] * c[i];
    const float b = -x[i + half] * s[i];
    o[i] = a + b;
  }
  for (int64_t i = half; i < dim; ++i) {
    const float a = x[i] * c[i];
    const float b = x[i - half] * s[i];
    o[i] = a + b;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rope_qkv(const at::Tensor& qkv, const at::Tensor& cos,
                                                      const at::Tensor& sin, int64_t heads, int64_t kv_heads) {
  check_rows(qkv, "qkv");
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  TORCH_CHECK(qkv.dim() == 2 && cos.dim() == 2 && cos.sizes() == sin.sizes(),
              "kvbench_dense::rope_qkv: qkv [T, (H + 2 KVH) D], cos and sin [T, D]; got ", qkv.sizes(), ", ",
              cos.sizes(), ", ", sin.sizes());
  const int64_t t = qkv.size(0), dim = cos.size(1);
  TORCH_CHECK(cos.size(0) == t && dim % 2 == 0 && qkv.size(1) == (heads + 2 * kv_heads) * dim,
              "kvbench_dense::rope_qkv: qkv ", qkv.sizes(), " is not [T, (", heads, " + 2 x ", kv_heads,
              ") x head_dim] for cos ", cos.sizes(), " (head_dim even)");
  at::Tensor q = at::empty({t, heads, dim}, qkv.options());
  at::Tensor k = at::empty({t, kv_heads, dim}, qkv.options());
  at::Tensor v = at::empty({t, kv_heads, dim}, qkv.options());
  const int64_t row = (heads + 2 * kv_heads) * dim;
  const float* xp = qkv.const_data_ptr<float>();
  const float* cp = cos.const_data_ptr<float>();
  const float* snp = sin.const_data_ptr<float>();
  float* qp = q.mutable_data_ptr<float>();
  float* kp = k.mutable_data_ptr<float>();
  float* vp = v.mutable_data_ptr<float>();
  for (int64_t r = 0; r < t; ++r) {
    const float* x = xp + r * row;
    const float* c = cp + r * dim;
    const float* s = snp + r * dim;
    for (int64_t h = 0; h < heads; ++h) rope_head(x + h * dim, c, s, qp + (r * heads + h) * dim, dim);
    for (int64_t h = 0; h < kv_heads; ++h)
      rope_head(x + (heads + h) * dim, c, s, kp + (r * kv_heads + h) * dim, dim);
    std::memcpy(vp + r * kv_heads * dim, x + (heads + kv_heads) * dim, sizeof(float) * kv_heads * dim);
  }
  return {q, k, v};
}

// exp(x) as 2^n * p(r), r = x - n ln2 with ln2 in two parts (Cephes' expf). Branch-free, so that a
// row's loop vectorizes: n is rounded by adding and subtracting 1.5 * 2^23 (round to nearest even).
// Within 2 ulp of the correctly rounded result over the clamped range.
inline float exp_poly(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  constexpr float kShift = 12582912.f;  // 1.5 * 2^23: adding it leaves round(z) in the low mantissa bits
  const float fn = (x * 1.44269504088896341f + kShift) - kShift;
  float r = x - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(fn) + 127) << 23;  // 2^n: n is in [-126, 127] after the clamp
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

// One row, compiled for the widest vectors the CPU has (chosen once, at load, by the loader's ifunc):
// SSE2's 4 lanes ran 2x slower than torch's own silu at decode sizes.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void silu_mul_row(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g / (1.f + exp_poly(-g))) * up[i];
  }
}

at::Tensor silu_mul(const at::Tensor& x) {
  check_rows(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "kvbench_dense::silu_mul: x must be [T, 2 I], got ",
              x.sizes());
  const int64_t t = x.size(0), n = x.size(1) / 2;
  at::Tensor y = at::empty({t, n}, x.options());
  const float* xp = x.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  for (int64_t r = 0; r < t; ++r) silu_mul_row(xp + r * 2 * n, xp + r * 2 * n + n, yp + r * n, n);
  return y;
}

// The greedy token of each row: the first index of the row's largest value, or of its first NaN if it
// has one, as torch.argmax, whose CPU kernel compares one element at a time (215 us for 8 x 32000 logits
// on the 2-core AMD EPYC). Two vector passes instead: the row's max and whether it holds a NaN, then the
// first element equal to the max (or the first NaN). A max never picks a NaN (maxps returns its second
// operand when either is NaN), and a comparison rounds nothing, so the index is torch's exactly.
// GCC 12 does not vectorize the plain loops (a max reduction with a select and an early exit): the
// vector paths are written out, chosen by the library's instruction set (cpu_isa.h).

int64_t first_match_portable(const float* x, int64_t from, int64_t n, float top, bool any_nan) {
  for (int64_t k = from; k < n; ++k)
    if (any_nan ? x[k] != x[k] : x[k] == top) return k;
  return 0;  // not reached: top is one of the row's values
}

// Elements [from, n) folded into the running max (NaN never taken) and the NaN flag.
void scan_max(const float* x, int64_t from, int64_t n, float& top, bool& any_nan) {
  for (int64_t i = from; i < n; ++i) {
    top = x[i] > top ? x[i] : top;
    any_nan = any_nan || (x[i] != x[i]);
  }
}

int64_t argmax_row_portable(const float* x, int64_t n) {
  float top = x[0];
  bool any_nan = false;
  scan_max(x, 0, n, top, any_nan);
  return first_match_portable(x, 0, n, top, any_nan);
}

#ifdef KVBENCH_X86
__attribute__((target("avx512f"))) int64_t argmax_row_avx512(const float* x, int64_t n) {
  constexpr int64_t w = 16;
  __m512 best0 = _mm512_set1_ps(x[0]), best1 = best0;  // two chains: a max's latency, not its throughput
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 2 * w <= n; i += 2 * w) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + w);
    best0 = _mm512_max_ps(a, best0);
    best1 = _mm512_max_ps(b, best1);
    nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
  }
  float top = _mm512_reduce_max_ps(_mm512_max_ps(best0, best1));
  bool any_nan = nan != 0;
  scan_max(x, i, n, top, any_nan);
  const __m512 t = _mm512_set1_ps(top);
  for (i = 0; i + w <= n; i += w) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __mmask16 hit = any_nan ? _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) : _mm512_cmp_ps_mask(v, t, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
  return first_match_portable(x, i, n, top, any_nan);
}

__attribute__((target("avx2"))) int64_t argmax_row_avx2(const float* x, int64_t n) {
  constexpr int64_t w = 8;
  __m256 best0 = _mm256_set1_ps(x[0]), best1 = best0;
  __m256 nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 2 * w <= n; i += 2 * w) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + w);
    best0 = _mm256_max_ps(a, best0);
    best1 = _mm256_max_ps(b, best1);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[w];
  _mm256_store_ps(lanes, _mm256_max_ps(best0, best1));
  float top = lanes[0];
  for (int j = 1; j < w; ++j) top = lanes[j] > top ? lanes[j] : top;
  bool any_nan = _mm256_movemask_ps(nan) != 0;
  scan_max(x, i, n, top, any_nan);
  const __m256 t = _mm256_set1_ps(top);
  for (i = 0; i + w <= n; i += w) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const int hit = _mm256_movemask_ps(any_nan ? _mm256_cmp_ps(v, v, _CMP_UNORD_Q) : _mm256_cmp_ps(v, t, _CMP_EQ_OQ));
    if (hit) return i + __builtin_ctz(hit);
  }
  return first_match_portable(x, i, n, top, any_nan);
}
#endif

int64_t argmax_row(const float* x, int64_t n) {
#ifdef KVBENCH_X86
  switch (kvbench_cpu::library_isa()) {
    case kvbench_cpu::Isa::kAvx512: return argmax_row_avx512(x, n);
    case kvbench_cpu::Isa::kAvx2: return argmax_row_avx2(x, n);
    case kvbench_cpu::Isa::kPortable: break;
  }
#endif
  return argmax_row_portable(x, n);
}

at::Tensor argmax_rows(const at::Tensor& x) {
  check_rows(x, "logits");
  TORCH_CHECK(x.dim() == 2 && x.size(1) > 0, "kvbench_dense::argmax_rows: logits must be [T, V > 0], got ",
              x.sizes());
  const int64_t t = x.size(0), n = x.size(1);
  at::Tensor out = at::empty({t}, x.options().dtype(at::kLong));
  const float* xp = x.const_data_ptr<float>();
  int64_t* op = out.mutable_data_ptr<int64_t>();
  for (int64_t r = 0; r < t; ++r) op[r] = argmax_row(xp + r * n, n);
  return out;
}

}  // namespace

TORCH_LIBRARY(kvbench_dense, m) {
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor h, Tensor d, Tensor w, float eps) -> (Tensor, Tensor)");
  m.def("rope_qkv(Tensor qkv, Tensor cos, Tensor sin, int heads, int kv_heads) -> (Tensor, Tensor, Tensor)");
  m.def("silu_mul(Tensor x) -> Tensor");
  m.def("argmax_rows(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvbench_dense, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("rope_qkv", &rope_qkv);
  m.impl("silu_mul", &silu_mul);
  m.impl("argmax_rows", &argmax_rows);
}
