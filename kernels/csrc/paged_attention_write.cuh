// paged_attention.cu's KV-cache writes: a float cache's row copy, and a quantized cache's write that
// quantizes each token's K and V rows (and stores their scales) on the way.
//
// Part of paged_attention.cu's one translation unit (nvcc's and the CPU emulator's builds compile that
// file alone): included there, after its headers, never on its own.

#pragma once

namespace {

template <typename T>
__global__ void __launch_bounds__(kNumThreads) write_kv_kernel(
    const T* __restrict__ key, const T* __restrict__ value, T* __restrict__ k_cache, T* __restrict__ v_cache,
    const int64_t* __restrict__ slot_mapping, int kv_heads, int head_dim, int log2_block_size, int64_t num_slots,
    int64_t key_stride_t, int64_t key_stride_h, int64_t value_stride_t, int64_t value_stride_h,
    int64_t cache_stride_block, int64_t cache_stride_token, int64_t cache_stride_head, bool vectorised) {
  const int token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0 || slot >= num_slots) return;  // negative: padding; too large: skipped, not scribbled
  const int64_t dst = (slot >> log2_block_size) * cache_stride_block +
                      (slot & ((int64_t{1} << log2_block_size) - 1)) * cache_stride_token;
  const T* k_src = key + token * key_stride_t;
  const T* v_src = value + token * value_stride_t;
  if (vectorised) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    const int chunks = head_dim / kVec;
    for (int i = threadIdx.x; i < kv_heads * chunks; i += kNumThreads) {
      const int h = i / chunks, d = (i % chunks) * kVec;
      *reinterpret_cast<uint4*>(k_cache + dst + h * cache_stride_head + d) =
          *reinterpret_cast<const uint4*>(k_src + h * key_stride_h + d);
      *reinterpret_cast<uint4*>(v_cache + dst + h * cache_stride_head + d) =
          *reinterpret_cast<const uint4*>(v_src + h * value_stride_h + d);
    }
  } else {
    for (int i = threadIdx.x; i < kv_heads * head_dim; i += kNumThreads) {
      const int h = i / head_dim, d = i % head_dim;
      k_cache[dst + h * cache_stride_head + d] = k_src[h * key_stride_h + d];
      v_cache[dst + h * cache_stride_head + d] = v_src[h * value_stride_h + d];
    }
  }
}

struct WriteQuantParams {
  const void* key;  // [num_tokens, kv_heads, head_dim] of T, strided between tokens and heads
  const void* value;
  void* k_cache;  // [num_blocks, block_size, kv_heads, head_dim] of a one-byte format C
  void* v_cache;
  float* k_scale;  // per tensor: one float, read; per token and kv head: [num_slots, kv_heads], written
  float* v_scale;
  const int64_t* slot_mapping;
  int kv_heads, head_dim, log2_block_size;
  int64_t num_slots;
  int64_t key_stride_t, key_stride_h, value_stride_t, value_stride_h;
  int64_t cache_stride_block, cache_stride_token, cache_stride_head;
};

// A warp's max of v that keeps a NaN (kv_quant.h max_keep_nan), as torch's amax does.
__device__ __forceinline__ float warp_max_keep_nan(float v) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off >>= 1)
    v = kvbench_quant::max_keep_nan(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// One block per token, as the float write. Each element is x / scale clamped to the format's range
// and rounded onto it (kv_quant.h: the reference's steps, so its exact bytes). Per tensor (!DYNAMIC),
// the threads stride over the token's whole row with the layer's scale. Per token and kv head, a
// warp takes a head: its lanes' |x| maxima, one warp max, the scale stored at the slot by lane 0,
// then the head's values quantized with it (read a second time, from L1: a head is a few hundred bytes).
// Single-byte stores: a row is a few hundred bytes per token, next to the decode's whole context.
template <typename T, typename C, bool DYNAMIC>
__global__ void __launch_bounds__(kNumThreads) write_kv_quant_kernel(const WriteQuantParams p) {
  const int token = blockIdx.x;
  const int64_t slot = p.slot_mapping[token];
  if (slot < 0 || slot >= p.num_slots) return;  // negative: padding; too large: skipped, not scribbled
  const int64_t dst = (slot >> p.log2_block_size) * p.cache_stride_block +
                      (slot & ((int64_t{1} << p.log2_block_size) - 1)) * p.cache_stride_token;
  for (int is_v = 0; is_v < 2; ++is_v) {  // K, then V: the same steps
    const T* src = static_cast<const T*>(is_v ? p.value : p.key) + token * (is_v ? p.value_stride_t : p.key_stride_t);
    const int64_t src_stride_h = is_v ? p.value_stride_h : p.key_stride_h;
    C* cache = static_cast<C*>(is_v ? p.v_cache : p.k_cache) + dst;
    float* scales = is_v ? p.v_scale : p.k_scale;
    if constexpr (DYNAMIC) {
      const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
      for (int h = warp; h < p.kv_heads; h += kNumWarps) {  // the same trip count on every lane of a warp
        const T* row = src + h * src_stride_h;
        float amax = 0.f;
        for (int d = lane; d < p.head_dim; d += kWarpSize)
          amax = kvbench_quant::max_keep_nan(amax, fabsf(to_float(row[d])));
        const float scale = kvbench_quant::scale_from_amax<C>(warp_max_keep_nan(amax));
        if (lane == 0) scales[slot * p.kv_heads + h] = scale;
        C* out = cache + h * p.cache_stride_head;
        for (int d = lane; d < p.head_dim; d += kWarpSize)
          out[d] = kvbench_quant::from_float_q(kvbench_quant::scaled_clamped<C>(to_float(row[d]), scale), C{});
      }
    } else {
      const float scale = scales[0];
      for (int i = threadIdx.x; i < p.kv_heads * p.head_dim; i += kNumThreads) {
        const int h = i / p.head_dim, d = i % p.head_dim;
        cache[h * p.cache_stride_head + d] =
            kvbench_quant::from_float_q(kvbench_quant::scaled_clamped<C>(to_float(src[h * src_stride_h + d]), scale),
                                        C{});
      }
    }
  }
}

}  // namespace
