// The extern "C" launchers of paged_attention.cu, declared once.
//
// paged_attention.cu includes this header, so the compiler checks every definition
// against its prototype; ops.cpp includes it to call them. extern "C" names carry no
// types, so two hand-kept copies could drift apart and still link.

#pragma once

#ifdef KVBENCH_CUDA_EMULATION
#include "cuda_emulation.h"  // cudaStream_t
#else
#include <cuda_runtime_api.h>  // cudaStream_t
#endif

#include <cstddef>
#include <cstdint>

extern "C" {

// Bytes of fp32 scratch the split-K path needs (0: one partition, no scratch), for a launch
// with the same sizes on the current device.
size_t kvbench_paged_decode_workspace_bytes(int batch, int num_heads, int kv_heads, int head_dim, int block_size,
                                            int max_blocks_per_seq);

// dtype (of q and out): 0 float32, 1 float16, 2 bfloat16. cache_dtype: dtype itself, or a one-byte
// quantized format (kv_quant.h: 3 float8_e4m3fn, 4 float8_e5m2, 5 int8) read with the fp32 k_scale /
// v_scale of scale_mode (kv_quant.h: 1 per tensor, one float each; 2 per token and kv head,
// [num_blocks, block_size, kv_heads] contiguous); scale_mode 0 and null scales for a float cache.
// window > 0: a sliding window in tokens (keys before context_len - window are masked, the blocks before
// its first key not read); 0 or less: none. sinks: null, or fp32 [num_heads] attention sinks (a logit per
// query head in every softmax's denominator). Returns 0 or a status for kvbench_cuda_status_string.
int kvbench_paged_decode_attention(void* out, const void* q, const void* k_cache, const void* v_cache,
                                   const int32_t* block_tables, const int32_t* context_lens, void* workspace,
                                   int dtype, int cache_dtype, const float* k_scale, const float* v_scale,
                                   int scale_mode, int batch, int num_heads, int kv_heads, int head_dim, int block_size,
                                   int max_blocks_per_seq, int64_t q_stride_b, int64_t q_stride_h,
                                   int64_t out_stride_b, int64_t out_stride_h, int64_t cache_stride_block,
                                   int64_t cache_stride_token, int64_t cache_stride_head, int64_t block_table_stride,
                                   float scale, int window, const float* sinks, cudaStream_t stream);

// Stores key/value rows [num_tokens, kv_heads, head_dim] into their slots; slot < 0 is skipped.
int kvbench_write_kv(const void* key, const void* value, void* k_cache, void* v_cache, const int64_t* slot_mapping,
                     int dtype, int num_tokens, int kv_heads, int head_dim, int block_size, int64_t num_slots,
                     int64_t key_stride_t, int64_t key_stride_h, int64_t value_stride_t, int64_t value_stride_h,
                     int64_t cache_stride_block, int64_t cache_stride_token, int64_t cache_stride_head,
                     cudaStream_t stream);

// Quantizes key/value rows [num_tokens, kv_heads, head_dim] of dtype (0 float32, 1 float16, 2 bfloat16)
// into a cache of cache_dtype (kv_quant.h: 3 float8_e4m3fn, 4 float8_e5m2, 5 int8) at their slots, as
// kernels/quant.py does; slot < 0 is skipped. scale_mode 1 (per tensor): k_scale / v_scale are one fp32
// each, read; 2 (per token and kv head): [num_slots, kv_heads] contiguous, each written slot's written.
int kvbench_write_kv_quant(const void* key, const void* value, void* k_cache, void* v_cache, float* k_scale,
                           float* v_scale, const int64_t* slot_mapping, int dtype, int cache_dtype, int scale_mode,
                           int num_tokens, int kv_heads, int head_dim, int block_size, int64_t num_slots,
                           int64_t key_stride_t, int64_t key_stride_h, int64_t value_stride_t,
                           int64_t value_stride_h, int64_t cache_stride_block, int64_t cache_stride_token,
                           int64_t cache_stride_head, cudaStream_t stream);

const char* kvbench_cuda_status_string(int status);

}  // extern "C"
