// Paged decode attention and KV-cache writes on CPU (layout: kernels/reference.py).
//
// Parallel over (sequence, kv_head): one task computes every query head of a GQA
// group, so each K/V row is read once and reused from L1 by the whole group.
// Two passes (scores + softmax, then probs @ V) in fp32; half and bfloat16 rows
// are widened to a float buffer first. Arguments are checked in ops.cpp.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace kvbench {
namespace {

// Independent partial sums: the compiler vectorises these without -ffast-math,
// which it may not do for a single running sum (that would reassociate).
constexpr int kLanes = 16;

inline float dot(const float* __restrict__ a, const float* __restrict__ b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0.f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

inline void axpy(float* __restrict__ y, float a, const float* __restrict__ x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// A float view of one head_dim row: the row itself for float, else widened into buf.
template <typename T>
inline const float* as_float(const T* row, float* buf, int64_t n) {
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(row[i]);
  return buf;
}
template <>
inline const float* as_float<float>(const float* row, float*, int64_t) {
  return row;
}

// Rows of one kv head sit a whole token apart (kv_heads * head_dim) in randomly
// placed blocks, which defeats the hardware prefetcher: fetch a few rows ahead.
constexpr int64_t kPrefetchRows = 8;

template <typename T>
inline void prefetch_row(const T* row, int64_t n) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < n * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(p + off);
}

struct Geometry {
  int64_t batch, heads, kv_heads, group, head_dim, block_size, width;
  int64_t q_sb, q_sh, out_sb, out_sh, c_sb, c_st, c_sh;
};

// One (sequence, kv_head) task; `scores` is [group][ctx], `acc` [group][head_dim].
template <typename T>
void attend_group(const Geometry& g, const T* q, const T* k_cache, const T* v_cache, const int32_t* table,
                  int64_t ctx, int64_t b, int64_t h, float scale, T* out, std::vector<float>& scores,
                  std::vector<float>& qf, std::vector<float>& acc, std::vector<float>& row) {
  const int64_t D = g.head_dim, G = g.group;
  T* out_group = out + b * g.out_sb + h * G * g.out_sh;
  if (ctx <= 0) {  // nothing to attend to: zeros, not 0/0
    for (int64_t j = 0; j < G; ++j)
      for (int64_t d = 0; d < D; ++d) out_group[j * g.out_sh + d] = static_cast<T>(0.f);
    return;
  }
  const T* q_group = q + b * g.q_sb + h * G * g.q_sh;
  for (int64_t j = 0; j < G; ++j)
    for (int64_t d = 0; d < D; ++d) qf[j * D + d] = static_cast<float>(q_group[j * g.q_sh + d]) * scale;
  auto row_offset = [&](int64_t t) {
    return table[t / g.block_size] * g.c_sb + (t % g.block_size) * g.c_st + h * g.c_sh;
  };

  scores.resize(G * ctx);
  for (int64_t t = 0; t < ctx; ++t) {
    if (t + kPrefetchRows < ctx) prefetch_row(k_cache + row_offset(t + kPrefetchRows), D);
    const float* k = as_float(k_cache + row_offset(t), row.data(), D);
    for (int64_t j = 0; j < G; ++j) scores[j * ctx + t] = dot(qf.data() + j * D, k, D);
  }
  std::vector<float> inv_sum(G);
  for (int64_t j = 0; j < G; ++j) {
    float* s = scores.data() + j * ctx;
    const float m = *std::max_element(s, s + ctx);
    float sum = 0.f;
    for (int64_t t = 0; t < ctx; ++t) {
      s[t] = std::exp(s[t] - m);
      sum += s[t];
    }
    inv_sum[j] = 1.f / sum;
  }

  std::fill(acc.begin(), acc.end(), 0.f);
  for (int64_t t = 0; t < ctx; ++t) {
    if (t + kPrefetchRows < ctx) prefetch_row(v_cache + row_offset(t + kPrefetchRows), D);
    const float* v = as_float(v_cache + row_offset(t), row.data(), D);
    for (int64_t j = 0; j < G; ++j) axpy(acc.data() + j * D, scores[j * ctx + t], v, D);
  }
  for (int64_t j = 0; j < G; ++j)
    for (int64_t d = 0; d < D; ++d) out_group[j * g.out_sh + d] = static_cast<T>(acc[j * D + d] * inv_sum[j]);
}

}  // namespace

at::Tensor paged_decode_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                      const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  at::Tensor out = at::empty(q.sizes(), q.options());
  Geometry g{};
  g.batch = q.size(0);
  g.heads = q.size(1);
  g.head_dim = q.size(2);
  g.block_size = k_cache.size(1);
  g.kv_heads = k_cache.size(2);
  g.group = g.heads / g.kv_heads;
  g.width = block_tables.size(1);
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
    for (int64_t i = 0; i < (lens[b] + g.block_size - 1) / g.block_size; ++i) {
      const int32_t block = tables[b * g.width + i];
      TORCH_CHECK(block >= 0 && block < num_blocks, "kvbench.paged_decode_attention: block_tables[", b, ", ", i,
                  "] = ", block, " is outside [0, ", num_blocks, ")");
    }
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "kvbench_paged_decode_attention_cpu", [&] {
    const auto* q_ptr = q.data_ptr<scalar_t>();
    const auto* k_ptr = k_cache.data_ptr<scalar_t>();
    const auto* v_ptr = v_cache.data_ptr<scalar_t>();
    auto* out_ptr = out.data_ptr<scalar_t>();
    at::parallel_for(0, g.batch * g.kv_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores, qf(g.group * g.head_dim), acc(g.group * g.head_dim), row(g.head_dim);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t b = i / g.kv_heads, h = i % g.kv_heads;
        attend_group<scalar_t>(g, q_ptr, k_ptr, v_ptr, tables + b * g.width, lens[b], b, h,
                               static_cast<float>(scale), out_ptr, scores, qf, acc, row);
      }
    });
  });
  return out;
}

void write_kv_cpu(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                  const at::Tensor& slot_mapping) {
  const int64_t tokens = key.size(0), kv_heads = key.size(1), head_dim = key.size(2);
  const int64_t block_size = k_cache.size(1), num_slots = k_cache.size(0) * block_size;
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slots[t] < num_slots, "kvbench.write_kv: slot_mapping[", t, "] = ", slots[t],
                " is past the cache's ", num_slots, " slots");
  const int64_t elem = key.element_size();
  const auto* k_src = static_cast<const char*>(key.data_ptr());
  const auto* v_src = static_cast<const char*>(value.data_ptr());
  auto* k_dst = static_cast<char*>(k_cache.data_ptr());
  auto* v_dst = static_cast<char*>(v_cache.data_ptr());
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = slots[t];
      if (slot < 0) continue;  // padding token
      const int64_t dst = (slot / block_size) * k_cache.stride(0) + (slot % block_size) * k_cache.stride(1);
      for (int64_t h = 0; h < kv_heads; ++h) {
        const int64_t d_off = (dst + h * k_cache.stride(2)) * elem;
        std::memcpy(k_dst + d_off, k_src + (t * key.stride(0) + h * key.stride(1)) * elem, head_dim * elem);
        std::memcpy(v_dst + d_off, v_src + (t * value.stride(0) + h * value.stride(1)) * elem, head_dim * elem);
      }
    }
  });
}

}  // namespace kvbench
