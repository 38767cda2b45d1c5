// KV-cache writes on CPU (layout: kernels/reference.py): each token's K and V rows copied to their slot,
// in parallel over tokens; a quantized cache's write takes kernels/quant.py's steps through kv_quant.h's
// encoders, the CUDA kernel's own, so both store the reference's bytes, and a dynamic scale per token and
// kv head goes beside the values. Arguments are checked in ops.cpp.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
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

namespace {

// One token's K (or V) rows, [kv_heads, head_dim] from ``src`` (strided between heads), quantized
// into the cache row at ``dst``: per tensor with ``*scale``; per token and kv head (``dynamic``)
// with each head's own scale, stored at ``scale[h]`` (the slot's scales). ``row``: head_dim floats.
template <typename T, typename C>
void quantize_token(const T* src, int64_t src_stride_h, C* dst, int64_t dst_stride_h, float* scale, bool dynamic,
                    int64_t kv_heads, int64_t head_dim, float* row) {
  for (int64_t h = 0; h < kv_heads; ++h) {
    const T* x = src + h * src_stride_h;
    float amax = 0.f;
    for (int64_t d = 0; d < head_dim; ++d) {
      row[d] = static_cast<float>(x[d]);  // exact from float, half and bfloat16
      amax = kvbench_quant::max_keep_nan(amax, std::fabs(row[d]));
    }
    float s = scale[0];
    if (dynamic) {
      s = kvbench_quant::scale_from_amax<C>(amax);
      scale[h] = s;
    }
    C* out = dst + h * dst_stride_h;
    for (int64_t d = 0; d < head_dim; ++d)
      out[d] = kvbench_quant::from_float_q(kvbench_quant::scaled_clamped<C>(row[d], s), C{});
  }
}

}  // namespace

void write_kv_quant_cpu(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                        const at::Tensor& slot_mapping, at::Tensor& k_scale, at::Tensor& v_scale) {
  const int64_t tokens = key.size(0), kv_heads = key.size(1), head_dim = key.size(2);
  const int64_t block_size = k_cache.size(1), num_slots = k_cache.size(0) * block_size;
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slots[t] < num_slots, "kvbench.write_kv_quant: slot_mapping[", t, "] = ", slots[t],
                " is past the cache's ", num_slots, " slots");
  const bool dynamic = k_scale.dim() != 0;  // ops.cpp checked: 0-dim, or [num_blocks, block_size, kv_heads]
  float* k_scales = k_scale.data_ptr<float>();
  float* v_scales = v_scale.data_ptr<float>();
  // T: key/value; C: the cache's one-byte element.
  auto run = [&](auto t_tag, auto c_tag) {
    using T = decltype(t_tag);
    using C = decltype(c_tag);
    const T* k_src = static_cast<const T*>(key.data_ptr());
    const T* v_src = static_cast<const T*>(value.data_ptr());
    C* k_dst = static_cast<C*>(k_cache.data_ptr());
    C* v_dst = static_cast<C*>(v_cache.data_ptr());
    at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> row(head_dim);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;  // padding token
        const int64_t dst = (slot / block_size) * k_cache.stride(0) + (slot % block_size) * k_cache.stride(1);
        // Per token and kv head, the slot's scales: [num_blocks, block_size, kv_heads] contiguous.
        const int64_t scale_at = dynamic ? slot * kv_heads : 0;
        quantize_token(k_src + t * key.stride(0), key.stride(1), k_dst + dst, k_cache.stride(2), k_scales + scale_at,
                       dynamic, kv_heads, head_dim, row.data());
        quantize_token(v_src + t * value.stride(0), value.stride(1), v_dst + dst, v_cache.stride(2),
                       v_scales + scale_at, dynamic, kv_heads, head_dim, row.data());
      }
    });
  };
  auto run_rows = [&](auto cache_tag) {
    switch (key.scalar_type()) {  // ops.cpp admits only these
      case at::kFloat: run(float{}, cache_tag); break;
      case at::kHalf: run(c10::Half{}, cache_tag); break;
      case at::kBFloat16: run(c10::BFloat16{}, cache_tag); break;
      default: TORCH_CHECK(false, "kvbench.write_kv_quant: unsupported key dtype ", key.scalar_type());
    }
  };
  switch (k_cache.scalar_type()) {
    case at::kFloat8_e4m3fn: run_rows(kvbench_quant::Fp8E4M3{}); break;
    case at::kFloat8_e5m2: run_rows(kvbench_quant::Fp8E5M2{}); break;
    case at::kChar: run_rows(int8_t{}); break;
    default: TORCH_CHECK(false, "kvbench.write_kv_quant: unsupported cache dtype ", k_cache.scalar_type());
  }
}

}  // namespace kvbench
