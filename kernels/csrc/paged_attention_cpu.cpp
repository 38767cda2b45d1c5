// Paged decode attention on CPU (layout: kernels/reference.py); the KV-cache writes are kv_write_cpu.cpp.
//
// Parallel over (sequence, kv_head) with at::parallel_for; a task takes a range of
// kv heads (all of them when there are enough sequences to keep the threads busy)
// and every query head of their GQA groups, so each K/V row is read once, reused
// from L1 by its group, and one token's rows are read as one contiguous run.
// Two passes (scores + softmax, then probs @ V) in fp32; half and bfloat16 rows
// are widened to a float buffer first. A quantized cache's rows (fp8 e4m3 / e5m2,
// int8: kv_quant.h) are decoded branch-free, so the loop vectorises, and multiplied by their
// scale (per tensor, or per token and kv head) as they are widened: the reference's
// dequantized values exactly (kernels/quant.py). Attention sinks (kernels/sinks.py) join each
// head's softmax once, outside the key loops. Arguments are checked in ops.cpp.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace kvbench {
namespace {

// An x86-64-v3 (AVX2 + FMA) clone of the hot loop beside the baseline one, picked
// at load time by the CPU's ISA level, so a cached build stays portable across CPUs.
// ("arch=haswell" would not do: its resolver matches that CPU model only.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define KVBENCH_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KVBENCH_MULTIVERSION
#endif
#define KVBENCH_INLINE __attribute__((always_inline)) inline

// 8-float vectors (GCC/Clang vector extension): 256-bit registers in the x86-64-v3
// clone, pairs of 128-bit ones in the baseline. Supported head dims (multiples of
// 16) get unrolled copies; any other takes the scalar loop.
typedef float f32x8 __attribute__((vector_size(32)));

KVBENCH_INLINE f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

KVBENCH_INLINE void store8(float* p, f32x8 v) { std::memcpy(p, &v, sizeof v); }

template <int N>
KVBENCH_INLINE float dot_fixed(const float* __restrict__ a, const float* __restrict__ b) {
  static_assert(N % 16 == 0, "unrolled head dims are whole multiples of 16");
  f32x8 acc0 = {}, acc1 = {};  // two chains, so the adds overlap
#pragma GCC unroll 16
  for (int i = 0; i < N; i += 16) {
    acc0 += load8(a + i) * load8(b + i);
    acc1 += load8(a + i + 8) * load8(b + i + 8);
  }
  const f32x8 s = acc0 + acc1;
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

template <int N>
KVBENCH_INLINE void axpy_fixed(float* __restrict__ y, float a, const float* __restrict__ x) {
#pragma GCC unroll 32
  for (int i = 0; i < N; i += 8) store8(y + i, load8(y + i) + a * load8(x + i));
}

KVBENCH_INLINE float dot(const float* __restrict__ a, const float* __restrict__ b, int64_t n) {
  switch (n) {  // the same case on every call: predicted
    case 64: return dot_fixed<64>(a, b);
    case 80: return dot_fixed<80>(a, b);
    case 96: return dot_fixed<96>(a, b);
    case 128: return dot_fixed<128>(a, b);
    case 256: return dot_fixed<256>(a, b);
    case 576: return dot_fixed<576>(a, b);  // MLA's latent + rotary key (DeepSeek)
    default: {
      float s = 0.f;
      for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
      return s;
    }
  }
}

KVBENCH_INLINE void axpy(float* __restrict__ y, float a, const float* __restrict__ x, int64_t n) {
  switch (n) {
    case 64: return axpy_fixed<64>(y, a, x);
    case 80: return axpy_fixed<80>(y, a, x);
    case 96: return axpy_fixed<96>(y, a, x);
    case 128: return axpy_fixed<128>(y, a, x);
    case 256: return axpy_fixed<256>(y, a, x);
    case 576: return axpy_fixed<576>(y, a, x);
    default:
      for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
  }
}

// A float view of one head_dim row: the row itself for float, else widened into buf.
template <typename T>
KVBENCH_INLINE const float* as_float(const T* row, float* buf, int64_t n) {
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(row[i]);
  return buf;
}
template <>
KVBENCH_INLINE const float* as_float<float>(const float* row, float*, int64_t) {
  return row;
}
// c10::Half's own conversion branches per element; this one (after F. Giesen's
// half_to_float) selects with masks instead, so the loop vectorises. Exact for every
// finite and infinite half; NaN stays NaN.
KVBENCH_INLINE float half_bits_to_float(uint16_t h) {
  constexpr uint32_t kShiftedExp = 0x7c00u << 13;  // the half exponent field, moved to fp32's place
  uint32_t bits = (h & 0x7fffu) << 13;
  const uint32_t exp = bits & kShiftedExp;
  const uint32_t is_special = 0u - static_cast<uint32_t>(exp == kShiftedExp);  // Inf / NaN: all ones
  const uint32_t is_small = 0u - static_cast<uint32_t>(exp == 0);              // zero / subnormal
  bits += (127 - 15) << 23;
  bits += is_special & ((128 - 16) << 23);  // keep an all-ones exponent
  // Zero / subnormal: renormalise by a float subtraction of 2^-14 (the subnormal scale).
  float small;
  const uint32_t small_in = bits + (1u << 23);
  std::memcpy(&small, &small_in, sizeof small);
  small -= 6.103515625e-05f;
  uint32_t small_bits;
  std::memcpy(&small_bits, &small, sizeof small_bits);
  bits = (small_bits & is_small) | (bits & ~is_small);
  bits |= static_cast<uint32_t>(h & 0x8000u) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <>
KVBENCH_INLINE const float* as_float<c10::Half>(const c10::Half* row, float* buf, int64_t n) {
  for (int64_t i = 0; i < n; ++i) buf[i] = half_bits_to_float(row[i].x);
  return buf;
}

// One byte of each format to float, branch-free so a row's loop vectorises (a table lookup,
// a gather per element, measured ~2x the fp32 kernel's time). Each is exact for all 256 bytes
// (tests/helpers/byte_decode_cases.py checks them through the op), as kv_quant.h's decodes are.
// int8: the integer itself.
KVBENCH_INLINE float byte_to_float(int8_t b) { return static_cast<float>(b); }
// float8_e5m2 is the top byte of a half: its bits shifted up are that half, inf and NaN included.
KVBENCH_INLINE float byte_to_float(kvbench_quant::Fp8E5M2 b) {
  return half_bits_to_float(static_cast<uint16_t>(b.bits << 8));
}
// float8_e4m3fn's exponent and mantissa placed in a half's fields (exponent bits 13-10, mantissa
// 9-7) read as 2^-8 times its magnitude, subnormals included (the biases differ by 8); x256 is
// exact. Its one NaN pattern (S.1111.111) would read as 480: selected out by a mask.
KVBENCH_INLINE float byte_to_float(kvbench_quant::Fp8E4M3 b) {
  const float mag = half_bits_to_float(static_cast<uint16_t>((b.bits & 0x7fu) << 7)) * 256.f;
  uint32_t bits;
  std::memcpy(&bits, &mag, sizeof bits);
  const uint32_t is_nan = 0u - static_cast<uint32_t>((b.bits & 0x7fu) == 0x7fu);
  bits = (0x7fc00000u & is_nan) | (bits & ~is_nan);
  bits |= static_cast<uint32_t>(b.bits & 0x80u) << 24;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// A quantized row widened: float(byte) * scale, the reference's ``stored.float() * scale``.
template <typename Q>
KVBENCH_INLINE const float* dequant_row(const Q* row, float* buf, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) buf[i] = byte_to_float(row[i]) * scale;
  return buf;
}

// Where a quantized cache's scales are: one K and one V scale (per tensor) or one per
// (block, token, kv head) laid out [num_blocks, block_size, kv_heads] (dynamic).
struct CacheScales {
  const float* k = nullptr;
  const float* v = nullptr;
  bool dynamic = false;
};

// Tokens sit in randomly placed blocks, which the hardware prefetcher follows
// poorly: fetch a few tokens ahead.
constexpr int64_t kPrefetchRows = 8;

template <typename T>
KVBENCH_INLINE void prefetch_row(const T* row, int64_t n) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(p + off);
}

struct Geometry {
  int64_t batch, heads, kv_heads, group, head_dim, block_size, width, kv_per_task, tasks_per_seq;
  int64_t window;  // a sliding window in tokens (keys before ctx - window are not read); <= 0: none
  int64_t q_sb, q_sh, out_sb, out_sh, c_sb, c_st, c_sh;
};

// Tasks [begin, end) of the (sequence, kv-head range) grid. A task serves every query
// head of its kv heads, so each K/V row is read once, and its kv heads' rows of one
// token are adjacent in memory (one contiguous read per token).
// T: q and out; C: the cache's elements (T itself, or a one-byte quantized type read with ``qs``).
template <typename T, typename C>
KVBENCH_MULTIVERSION void attend_groups(const Geometry& g, const T* q, const C* k_cache, const C* v_cache,
                                        const int32_t* tables, const int32_t* lens, float scale, T* out,
                                        int64_t begin, int64_t end, const CacheScales& qs, const float* sinks) {
  constexpr bool kQuant = sizeof(C) == 1;
  const int64_t D = g.head_dim, G = g.group, max_rows = g.kv_per_task * G;
  std::vector<float> scores, qf(max_rows * D), acc(max_rows * D), row(D), inv_sum(max_rows);
  for (int64_t task = begin; task < end; ++task) {
    const int64_t b = task / g.tasks_per_seq, h0 = (task % g.tasks_per_seq) * g.kv_per_task;
    const int64_t nh = std::min(g.kv_per_task, g.kv_heads - h0), rows = nh * G, end = lens[b];
    // Keys [first, end): a sliding window starts the loops at its first key, so it reads at most `window` rows.
    const int64_t first = g.window > 0 ? std::max<int64_t>(end - g.window, 0) : 0, ctx = end - first;
    const int32_t* table = tables + b * g.width;
    // Query heads h0*G .. (h0+nh)*G - 1 read kv heads h0 .. h0+nh-1: one contiguous range.
    T* out_rows = out + b * g.out_sb + h0 * G * g.out_sh;
    if (ctx <= 0) {  // nothing to attend to: zeros, not 0/0 (with a sink: all its weight, on a zero value)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < D; ++d) out_rows[r * g.out_sh + d] = static_cast<T>(0.f);
      continue;
    }
    const T* q_rows = q + b * g.q_sb + h0 * G * g.q_sh;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < D; ++d) qf[r * D + d] = static_cast<float>(q_rows[r * g.q_sh + d]) * scale;
    auto token_offset = [&](int64_t i) {  // the i-th key read, at position first + i
      const int64_t t = first + i;
      return table[t / g.block_size] * g.c_sb + (t % g.block_size) * g.c_st + h0 * g.c_sh;
    };
    const int64_t span = (nh - 1) * g.c_sh + D;  // elements from the first kv head's row to the last's end
    // A row's scale: the layer's, or its (block, token, kv head)'s.
    auto row_scale = [&](const float* s, int64_t i, int64_t hh) {
      if (!qs.dynamic) return s[0];
      const int64_t t = first + i;
      return s[(static_cast<int64_t>(table[t / g.block_size]) * g.block_size + t % g.block_size) * g.kv_heads + h0 +
               hh];
    };
    auto widen = [&](const C* r, const float* s, int64_t t, int64_t hh) -> const float* {
      if constexpr (kQuant) {
        return dequant_row(r, row.data(), D, row_scale(s, t, hh));
      } else {
        (void)s;
        return as_float(r, row.data(), D);
      }
    };

    // 1) scores = (q * scale) . k for every query head of the task
    scores.resize(rows * ctx);
    for (int64_t t = 0; t < ctx; ++t) {
      if (t + kPrefetchRows < ctx) prefetch_row(k_cache + token_offset(t + kPrefetchRows), span);
      const C* k_token = k_cache + token_offset(t);
      for (int64_t hh = 0; hh < nh; ++hh) {
        const float* k = widen(k_token + hh * g.c_sh, qs.k, t, hh);
        for (int64_t j = 0; j < G; ++j) scores[(hh * G + j) * ctx + t] = dot(qf.data() + (hh * G + j) * D, k, D);
      }
    }
    // 2) softmax, unnormalised; 1/sum is applied to the output. A sink is a key of score sink and value 0:
    // it raises the max and adds exp(sink - m) to the sum, once a row (query head h0 * G + r).
    for (int64_t r = 0; r < rows; ++r) {
      float* s = scores.data() + r * ctx;
      float m = *std::max_element(s, s + ctx), sum = 0.f;
      if (sinks != nullptr) {
        const float sink = sinks[h0 * G + r];
        m = std::max(m, sink);
        sum = std::exp(sink - m);
      }
      for (int64_t t = 0; t < ctx; ++t) {
        s[t] = std::exp(s[t] - m);
        sum += s[t];
      }
      inv_sum[r] = 1.f / sum;
    }
    // 3) probs @ V
    std::fill(acc.begin(), acc.begin() + rows * D, 0.f);
    for (int64_t t = 0; t < ctx; ++t) {
      if (t + kPrefetchRows < ctx) prefetch_row(v_cache + token_offset(t + kPrefetchRows), span);
      const C* v_token = v_cache + token_offset(t);
      for (int64_t hh = 0; hh < nh; ++hh) {
        const float* v = widen(v_token + hh * g.c_sh, qs.v, t, hh);
        for (int64_t j = 0; j < G; ++j) axpy(acc.data() + (hh * G + j) * D, scores[(hh * G + j) * ctx + t], v, D);
      }
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < D; ++d) out_rows[r * g.out_sh + d] = static_cast<T>(acc[r * D + d] * inv_sum[r]);
  }
}

}  // namespace

void paged_decode_attention_cpu_out(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                    const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                                    at::Tensor& out, const std::optional<at::Tensor>& k_scale,
                                    const std::optional<at::Tensor>& v_scale, int64_t window,
                                    const std::optional<at::Tensor>& sinks) {
  Geometry g{};
  g.window = window;
  g.batch = q.size(0);
  g.heads = q.size(1);
  g.head_dim = q.size(2);
  g.block_size = k_cache.size(1);
  g.kv_heads = k_cache.size(2);
  g.group = g.heads / g.kv_heads;
  g.width = block_tables.size(1);
  // Whole sequences per task when there are enough of them to keep every thread busy;
  // else split the kv heads (down to one per task) until there are about two tasks per thread.
  const int64_t wanted_tasks = 2 * at::get_num_threads(), batch = std::max<int64_t>(g.batch, 1);
  const int64_t splits = std::clamp<int64_t>((wanted_tasks + batch - 1) / batch, 1, g.kv_heads);
  g.kv_per_task = (g.kv_heads + splits - 1) / splits;
  g.tasks_per_seq = (g.kv_heads + g.kv_per_task - 1) / g.kv_per_task;
  g.q_sb = q.stride(0);
  g.q_sh = q.stride(1);
  g.out_sb = out.stride(0);
  g.out_sh = out.stride(1);
  g.c_sb = k_cache.stride(0);
  g.c_st = k_cache.stride(1);
  g.c_sh = k_cache.stride(2);
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  const int64_t num_blocks = k_cache.size(0);
  // Checked here, once, so the parallel loop below never throws.
  for (int64_t b = 0; b < g.batch; ++b) {
    TORCH_CHECK(lens[b] >= 0 && lens[b] <= g.width * g.block_size, "kvbench.paged_decode_attention: context_lens[",
                b, "] = ", lens[b], " is outside [0, ", g.width * g.block_size, "] (block table width x block_size)");
    const int64_t first = window > 0 ? std::max<int64_t>(lens[b] - window, 0) : 0;  // the blocks read
    for (int64_t i = first / g.block_size; i < (lens[b] + g.block_size - 1) / g.block_size; ++i) {
      const int32_t block = tables[b * g.width + i];
      TORCH_CHECK(block >= 0 && block < num_blocks, "kvbench.paged_decode_attention: block_tables[", b, ", ", i,
                  "] = ", block, " is outside [0, ", num_blocks, ")");
    }
  }
  CacheScales qs;  // ops.cpp checked: both scales with a one-byte cache, neither with a float one
  if (k_scale.has_value()) {
    qs.k = k_scale->data_ptr<float>();
    qs.v = v_scale->data_ptr<float>();
    qs.dynamic = k_scale->dim() != 0;
  }
  const float* sink_ptr = sinks.has_value() ? sinks->data_ptr<float>() : nullptr;  // ops.cpp checked: [heads] fp32
  // T: q and out; C: the cache's element, T itself for a float cache.
  auto run = [&](auto q_tag, auto cache_tag) {
    using T = decltype(q_tag);
    using C = decltype(cache_tag);
    const T* q_ptr = static_cast<const T*>(q.data_ptr());
    const C* k_ptr = static_cast<const C*>(k_cache.data_ptr());
    const C* v_ptr = static_cast<const C*>(v_cache.data_ptr());
    T* out_ptr = static_cast<T*>(out.data_ptr());
    at::parallel_for(0, g.batch * g.tasks_per_seq, 1, [&](int64_t begin, int64_t end) {
      attend_groups<T, C>(g, q_ptr, k_ptr, v_ptr, tables, lens, static_cast<float>(scale), out_ptr, begin, end, qs,
                          sink_ptr);
    });
  };
  auto run_q = [&](auto cache_tag) {
    switch (q.scalar_type()) {
      case at::kFloat: run(float{}, cache_tag); break;
      case at::kHalf: run(c10::Half{}, cache_tag); break;
      case at::kBFloat16: run(c10::BFloat16{}, cache_tag); break;
      default: TORCH_CHECK(false, "kvbench.paged_decode_attention: unsupported q dtype ", q.scalar_type());
    }
  };
  switch (k_cache.scalar_type()) {  // ops.cpp admits only these
    case at::kFloat: run(float{}, float{}); break;
    case at::kHalf: run(c10::Half{}, c10::Half{}); break;
    case at::kBFloat16: run(c10::BFloat16{}, c10::BFloat16{}); break;
    case at::kFloat8_e4m3fn: run_q(kvbench_quant::Fp8E4M3{}); break;
    case at::kFloat8_e5m2: run_q(kvbench_quant::Fp8E5M2{}); break;
    case at::kChar: run_q(int8_t{}); break;
    default: TORCH_CHECK(false, "kvbench.paged_decode_attention: unsupported cache dtype ", k_cache.scalar_type());
  }
}

}  // namespace kvbench
