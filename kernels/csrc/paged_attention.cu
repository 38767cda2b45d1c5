// Paged decode attention and KV-cache writes for CUDA (layout: kernels/reference.py).
//
// Decode: one query token per sequence. A thread block serves one
// (sequence, kv_head, partition) and up to 8 query heads of that GQA group (every
// head for the usual groups of 1-8; the block's accumulators are sized for the group,
// 1, 2, 4 or 8 heads, so small groups hold fewer registers), so each K/V row is read
// from HBM once per block. It streams the partition's K rows, then its V rows, through a ring of
// shared-memory tiles filled by cp.async, so several tiles are in flight while it
// computes (the bandwidth a decode kernel lives on). A partition is 512 tokens, or
// fewer (down to 128) when 512-token ones would leave SMs idle (few sequences, long
// contexts); when a context may span several partitions (split-K), each block writes an
// fp32 partial result plus its softmax max and sum, and a second kernel merges
// them. Scores, softmax and accumulation are fp32 whatever the cache dtype.
//
// Writes: one block per token stores its K and V rows at their slot. A quantized cache's write
// (write_kv_quant_kernel) quantizes them on the way, by kernels/quant.py's steps (kv_quant.h), so
// it stores the torch reference's bytes exactly; per token and kv head, each head's scale (its
// amax / qmax, one warp's reduction) goes beside the values, with no host sync.
//
// A quantized cache (one byte per element: fp8 e4m3 / e5m2 or int8, kv_quant.h) streams
// through the same ring as raw bytes (a 16-byte load is 16 elements) and is decoded in
// registers. Its scales (kernels/quant.py): per tensor, K's multiplies each score and V's
// the output, once; per token and kv head, each row's K scale multiplies its score and its
// V scale its probability as it weights the row. A float cache compiles none of this.
//
// The same source runs on CPU under cuda_emulation.h (see cuda_compat.h), which is how
// the tests check these kernels and launchers on a machine with no GPU.
//
// Block ids are trusted: an id outside the pool reads outside the cache (an illegal
// address on a GPU), as in vLLM's kernels: checking them would cost a device sync per
// call. The C++ CPU op checks them; kernels/validate.py checks shapes and dtypes.
//
// Launchers are extern "C" (declared in paged_attention.h), take raw pointers,
// sizes, strides and a stream, and return 0 or a status for
// kvbench_cuda_status_string(); they never throw, so they can be linked into a
// torch op built with or without torch's CUDA support.

#include "paged_attention.h"

#include "cuda_compat.h"
#include "kv_quant.h"

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "paged_attention_common.cuh"
#include "paged_attention_decode.cuh"
#include "paged_attention_write.cuh"

// Host side: launch shapes, the devices' cached facts, the launchers and their dtype dispatch.
namespace {

int log2_exact(int x) {  // -1 unless x is a power of two
  if (x <= 0 || (x & (x - 1)) != 0) return -1;
  int r = 0;
  while ((1 << r) < x) ++r;
  return r;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Launch-time facts about a device, cached so a decode step makes no driver queries.
// Device ids past kMaxDevices work, uncached.
constexpr int kMaxDevices = 64;

// The current device's SM count, 0 if it cannot be had (then partitions never shrink).
// Cached as g_smem_optin is (below).
std::atomic<int> g_num_sms[kMaxDevices];

int current_num_sms() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
#ifndef KVBENCH_CUDA_EMULATION  // the emulator's count may change between launches (the tests vary it)
  if (device < kMaxDevices && (sms = g_num_sms[device].load(std::memory_order_relaxed)) > 0) return sms;
#endif
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
  if (device < kMaxDevices) g_num_sms[device].store(sms, std::memory_order_relaxed);
  return sms;
}

// Tokens per partition: 512, halved (to 128 at least) while the grid would have fewer than
// kBlocksPerSm blocks per SM and the longest context still spans the partition, as the
// Triton kernel picks its splits (kernels/triton_paged.choose_num_splits): few sequences
// with long contexts then still fill the GPU. The workspace size and the launch both call
// this with the same arguments, so they agree.
int choose_partition(int batch, int kv_heads, int group, int64_t max_context, int num_sms) {
  const int64_t tiles = static_cast<int64_t>(batch) * kv_heads * head_tiles_for(group);
  int partition = kMaxPartition;
  while (partition > kMinPartition && max_context > partition &&
         tiles * ((max_context + partition - 1) / partition) < static_cast<int64_t>(kBlocksPerSm) * num_sms)
    partition /= 2;
  return partition;
}

int partitions_for(int64_t max_context, int partition) {
  return static_cast<int>((max_context + partition - 1) / partition);
}

// Each device's opt-in shared memory per block, 0 until first asked. Threads racing on
// the first launch both query it and store the same value, so relaxed atomics suffice.
std::atomic<int> g_smem_optin[kMaxDevices];

cudaError_t smem_optin_for(int device, int* smem_optin) {
  if (device < kMaxDevices) {
    *smem_optin = g_smem_optin[device].load(std::memory_order_relaxed);
    if (*smem_optin > 0) return cudaSuccess;
  }
  const cudaError_t err = cudaDeviceGetAttribute(smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess && device < kMaxDevices) g_smem_optin[device].store(*smem_optin, std::memory_order_relaxed);
  return err;
}

// Lets KERNEL take up to the device's opt-in shared memory, once per (device, kernel
// instantiation). The attribute is a ceiling each launch is checked against, not what a
// launch gets (that is its own dynamic size), so raising it to the limit once covers
// every later launch on the device, whatever its query-head group. (A cudaDeviceReset
// would undo it; torch never resets a device.)
// ``dynamic_max``: the opt-in limit (these kernels have no static shared memory).
template <auto KERNEL>
cudaError_t allow_optin_smem(int device, int dynamic_max) {
  static std::atomic<bool> raised[kMaxDevices];  // one array per instantiation
  if (device < kMaxDevices && raised[device].load(std::memory_order_acquire)) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_max);
  if (err == cudaSuccess && device < kMaxDevices) raised[device].store(true, std::memory_order_release);
  return err;
}

template <typename T, typename C, int HEAD_DIM, int HEADS>
int launch_decode(DecodeParams p, int batch, int kv_heads, cudaStream_t stream) {
  const int elems = 16 / static_cast<int>(sizeof(C));
  if (!aligned16(p.k_cache) || !aligned16(p.v_cache) || p.cache_stride_block % elems ||
      p.cache_stride_token % elems || p.cache_stride_head % elems)
    return kErrAlignment;
  const size_t smem = decode_smem_bytes<C, HEAD_DIM, HEADS>(p.group < HEADS ? p.group : HEADS, p.partition);
  int device = 0, smem_optin = 0;
  cudaError_t err = cudaGetDevice(&device);  // cheap: the calling thread's current device
  if (err == cudaSuccess) err = smem_optin_for(device, &smem_optin);
  if (err != cudaSuccess) return err;
  if (smem > static_cast<size_t>(smem_optin)) return kErrSharedMemory;
  if (smem > 48 * 1024) {  // the kernel has no static shared memory: its dynamic size is all of it
    err = allow_optin_smem<paged_decode_kernel<T, C, HEAD_DIM, HEADS>>(device, smem_optin);
    if (err != cudaSuccess) return err;
  }
  const bool split = p.part_out != nullptr;
  // The driver's grid limits (y and z at most 65535), as a status that names the sizes.
  if (batch > 65535 || p.max_partitions > 65535) return kErrGrid;
  const dim3 grid(kv_heads * p.head_tiles, batch, split ? p.max_partitions : 1);
  auto* decode_kernel = paged_decode_kernel<T, C, HEAD_DIM, HEADS>;  // a name without a comma, for the macro
  KVB_LAUNCH(decode_kernel, grid, kNumThreads, smem, stream, p);
  if (split) {
    const size_t merge_smem = sizeof(float) * (p.max_partitions + kNumWarps);
    if (merge_smem > static_cast<size_t>(smem_optin)) return kErrSharedMemory;
    if (merge_smem > 48 * 1024) {
      err = allow_optin_smem<merge_partitions_kernel<T, HEAD_DIM>>(device, smem_optin);
      if (err != cudaSuccess) return err;
    }
    auto* merge_kernel = merge_partitions_kernel<T, HEAD_DIM>;
    KVB_LAUNCH(merge_kernel, dim3(p.num_heads, batch), kNumThreads, merge_smem, stream, p);
  }
  return cudaGetLastError();
}

template <typename T, typename C, int HEAD_DIM>
int dispatch_heads(const DecodeParams& p, int batch, int kv_heads, cudaStream_t stream) {
  switch (heads_per_block(p.group)) {
    case 1: return launch_decode<T, C, HEAD_DIM, 1>(p, batch, kv_heads, stream);
    case 2: return launch_decode<T, C, HEAD_DIM, 2>(p, batch, kv_heads, stream);
    case 4: return launch_decode<T, C, HEAD_DIM, 4>(p, batch, kv_heads, stream);
    default: return launch_decode<T, C, HEAD_DIM, 8>(p, batch, kv_heads, stream);
  }
}

template <typename T, typename C = T>
int dispatch_head_dim(int head_dim, const DecodeParams& p, int batch, int kv_heads, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return dispatch_heads<T, C, 64>(p, batch, kv_heads, stream);
    case 80: return dispatch_heads<T, C, 80>(p, batch, kv_heads, stream);
    case 96: return dispatch_heads<T, C, 96>(p, batch, kv_heads, stream);
    case 128: return dispatch_heads<T, C, 128>(p, batch, kv_heads, stream);
    case 256: return dispatch_heads<T, C, 256>(p, batch, kv_heads, stream);
    case 576: return dispatch_heads<T, C, 576>(p, batch, kv_heads, stream);  // MLA's latent + rotary key, one kv head
    default: return kErrHeadDim;
  }
}

// A quantized cache of element type C, read for q / out of dtype.
template <typename C>
int dispatch_quantized(int dtype, int head_dim, const DecodeParams& p, int batch, int kv_heads, cudaStream_t stream) {
  switch (dtype) {
    case kFloat32: return dispatch_head_dim<float, C>(head_dim, p, batch, kv_heads, stream);
    case kFloat16: return dispatch_head_dim<__half, C>(head_dim, p, batch, kv_heads, stream);
    case kBFloat16: return dispatch_head_dim<__nv_bfloat16, C>(head_dim, p, batch, kv_heads, stream);
    default: return kErrDtype;
  }
}

template <typename T, typename C>
int launch_write_quant(const WriteQuantParams& p, bool dynamic, int num_tokens, cudaStream_t stream) {
  if (dynamic) {
    auto* kernel = write_kv_quant_kernel<T, C, true>;  // a name without a comma, for the macro
    KVB_LAUNCH(kernel, num_tokens, kNumThreads, 0, stream, p);
  } else {
    auto* kernel = write_kv_quant_kernel<T, C, false>;
    KVB_LAUNCH(kernel, num_tokens, kNumThreads, 0, stream, p);
  }
  return cudaGetLastError();
}

// Rows of dtype into a cache of the one-byte format C.
template <typename C>
int dispatch_write_quant(int dtype, const WriteQuantParams& p, bool dynamic, int num_tokens, cudaStream_t stream) {
  switch (dtype) {
    case kFloat32: return launch_write_quant<float, C>(p, dynamic, num_tokens, stream);
    case kFloat16: return launch_write_quant<__half, C>(p, dynamic, num_tokens, stream);
    case kBFloat16: return launch_write_quant<__nv_bfloat16, C>(p, dynamic, num_tokens, stream);
    default: return kErrDtype;
  }
}

}  // namespace

extern "C" {

size_t kvbench_paged_decode_workspace_bytes(int batch, int num_heads, int kv_heads, int head_dim, int block_size,
                                            int max_blocks_per_seq) {
  if (kv_heads <= 0 || num_heads % kv_heads != 0) return 0;  // the launch refuses these
  const int64_t max_context = static_cast<int64_t>(block_size) * max_blocks_per_seq;
  const int partition = choose_partition(batch, kv_heads, num_heads / kv_heads, max_context, current_num_sms());
  const int parts = partitions_for(max_context, partition);
  if (parts <= 1) return 0;
  const size_t rows = static_cast<size_t>(batch) * num_heads * parts;
  return sizeof(float) * rows * (static_cast<size_t>(head_dim) + 2);
}

int kvbench_paged_decode_attention(void* out, const void* q, const void* k_cache, const void* v_cache,
                                   const int32_t* block_tables, const int32_t* context_lens, void* workspace,
                                   int dtype, int cache_dtype, const float* k_scale, const float* v_scale,
                                   int scale_mode, int batch, int num_heads, int kv_heads, int head_dim,
                                   int block_size, int max_blocks_per_seq, int64_t q_stride_b, int64_t q_stride_h,
                                   int64_t out_stride_b, int64_t out_stride_h, int64_t cache_stride_block,
                                   int64_t cache_stride_token, int64_t cache_stride_head, int64_t block_table_stride,
                                   float scale, int window, const float* sinks, cudaStream_t stream) {
  if (kv_heads <= 0 || num_heads % kv_heads != 0 || max_blocks_per_seq < 0) return kErrShape;
  const bool quantized = cache_dtype != dtype;
  if (quantized ? (scale_mode != kvbench_quant::kScaleTensor && scale_mode != kvbench_quant::kScaleTokenHead) ||
                      k_scale == nullptr || v_scale == nullptr
                : scale_mode != kvbench_quant::kScaleNone)
    return kErrScales;
  const int log2_block_size = log2_exact(block_size);
  if (log2_block_size < 0 || block_size > 128) return kErrBlockSize;
  if (batch == 0 || num_heads == 0) return 0;
  DecodeParams p{};
  p.out = out;
  p.q = q;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.block_tables = block_tables;
  p.context_lens = context_lens;
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  p.scale_mode = scale_mode;
  p.window = window > 0 ? window : 0;
  p.sinks = sinks;
  p.kv_heads = kv_heads;
  p.num_heads = num_heads;
  p.group = num_heads / kv_heads;
  p.head_tiles = head_tiles_for(p.group);  // a block serves at most kMaxHeadTile query heads
  p.log2_block_size = log2_block_size;
  const int64_t max_context = static_cast<int64_t>(block_size) * max_blocks_per_seq;
  p.max_context = max_context > INT32_MAX ? INT32_MAX : static_cast<int>(max_context);
  p.partition = choose_partition(batch, kv_heads, p.group, max_context, current_num_sms());
  p.max_partitions = partitions_for(max_context, p.partition);
  p.q_stride_b = q_stride_b;
  p.q_stride_h = q_stride_h;
  p.out_stride_b = out_stride_b;
  p.out_stride_h = out_stride_h;
  p.cache_stride_block = cache_stride_block;
  p.cache_stride_token = cache_stride_token;
  p.cache_stride_head = cache_stride_head;
  p.bt_stride = block_table_stride;
  p.scale = scale;
  if (p.max_partitions > 1) {
    if (workspace == nullptr) return kErrShape;
    const size_t rows = static_cast<size_t>(batch) * num_heads * p.max_partitions;
    p.part_out = static_cast<float*>(workspace);
    p.part_max = p.part_out + rows * head_dim;
    p.part_sum = p.part_max + rows;
  }
  if (quantized) {
    switch (cache_dtype) {
      case kvbench_quant::kCacheFp8E4M3:
        return dispatch_quantized<kvbench_quant::Fp8E4M3>(dtype, head_dim, p, batch, kv_heads, stream);
      case kvbench_quant::kCacheFp8E5M2:
        return dispatch_quantized<kvbench_quant::Fp8E5M2>(dtype, head_dim, p, batch, kv_heads, stream);
      case kvbench_quant::kCacheInt8: return dispatch_quantized<int8_t>(dtype, head_dim, p, batch, kv_heads, stream);
      default: return kErrDtype;
    }
  }
  switch (dtype) {
    case kFloat32: return dispatch_head_dim<float>(head_dim, p, batch, kv_heads, stream);
    case kFloat16: return dispatch_head_dim<__half>(head_dim, p, batch, kv_heads, stream);
    case kBFloat16: return dispatch_head_dim<__nv_bfloat16>(head_dim, p, batch, kv_heads, stream);
    default: return kErrDtype;
  }
}

int kvbench_write_kv(const void* key, const void* value, void* k_cache, void* v_cache, const int64_t* slot_mapping,
                     int dtype, int num_tokens, int kv_heads, int head_dim, int block_size, int64_t num_slots,
                     int64_t key_stride_t, int64_t key_stride_h, int64_t value_stride_t, int64_t value_stride_h,
                     int64_t cache_stride_block, int64_t cache_stride_token, int64_t cache_stride_head,
                     cudaStream_t stream) {
  const int log2_block_size = log2_exact(block_size);
  if (log2_block_size < 0 || block_size > 128) return kErrBlockSize;
  if (num_tokens == 0 || kv_heads == 0 || head_dim == 0) return 0;
  const int elem = dtype == kFloat32 ? 4 : dtype == kFloat16 || dtype == kBFloat16 ? 2 : 0;
  if (elem == 0) return kErrDtype;
  const int vec = 16 / elem;
  bool vectorised = aligned16(key) && aligned16(value) && aligned16(k_cache) && aligned16(v_cache);
  for (int64_t s : {static_cast<int64_t>(head_dim), key_stride_t, key_stride_h, value_stride_t, value_stride_h,
                    cache_stride_block, cache_stride_token, cache_stride_head})
    vectorised = vectorised && s % vec == 0;
#define KVBENCH_WRITE_KV(T)                                                                                        \
  KVB_LAUNCH(write_kv_kernel<T>, num_tokens, kNumThreads, 0, stream,                                              \
      static_cast<const T*>(key), static_cast<const T*>(value), static_cast<T*>(k_cache), static_cast<T*>(v_cache), \
      slot_mapping, kv_heads, head_dim, log2_block_size, num_slots, key_stride_t, key_stride_h, value_stride_t,     \
      value_stride_h, cache_stride_block, cache_stride_token, cache_stride_head, vectorised)
  switch (dtype) {
    case kFloat32: KVBENCH_WRITE_KV(float); break;
    case kFloat16: KVBENCH_WRITE_KV(__half); break;
    default: KVBENCH_WRITE_KV(__nv_bfloat16); break;
  }
#undef KVBENCH_WRITE_KV
  return cudaGetLastError();
}

int kvbench_write_kv_quant(const void* key, const void* value, void* k_cache, void* v_cache, float* k_scale,
                           float* v_scale, const int64_t* slot_mapping, int dtype, int cache_dtype, int scale_mode,
                           int num_tokens, int kv_heads, int head_dim, int block_size, int64_t num_slots,
                           int64_t key_stride_t, int64_t key_stride_h, int64_t value_stride_t,
                           int64_t value_stride_h, int64_t cache_stride_block, int64_t cache_stride_token,
                           int64_t cache_stride_head, cudaStream_t stream) {
  const int log2_block_size = log2_exact(block_size);
  if (log2_block_size < 0 || block_size > 128) return kErrBlockSize;
  if ((scale_mode != kvbench_quant::kScaleTensor && scale_mode != kvbench_quant::kScaleTokenHead) ||
      k_scale == nullptr || v_scale == nullptr)
    return kErrScales;
  if (num_tokens == 0 || kv_heads == 0 || head_dim == 0) return 0;
  WriteQuantParams p{};
  p.key = key;
  p.value = value;
  p.k_cache = k_cache;
  p.v_cache = v_cache;
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  p.slot_mapping = slot_mapping;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.log2_block_size = log2_block_size;
  p.num_slots = num_slots;
  p.key_stride_t = key_stride_t;
  p.key_stride_h = key_stride_h;
  p.value_stride_t = value_stride_t;
  p.value_stride_h = value_stride_h;
  p.cache_stride_block = cache_stride_block;
  p.cache_stride_token = cache_stride_token;
  p.cache_stride_head = cache_stride_head;
  const bool dynamic = scale_mode == kvbench_quant::kScaleTokenHead;
  switch (cache_dtype) {
    case kvbench_quant::kCacheFp8E4M3:
      return dispatch_write_quant<kvbench_quant::Fp8E4M3>(dtype, p, dynamic, num_tokens, stream);
    case kvbench_quant::kCacheFp8E5M2:
      return dispatch_write_quant<kvbench_quant::Fp8E5M2>(dtype, p, dynamic, num_tokens, stream);
    case kvbench_quant::kCacheInt8: return dispatch_write_quant<int8_t>(dtype, p, dynamic, num_tokens, stream);
    default: return kErrDtype;
  }
}

const char* kvbench_cuda_status_string(int status) {
  switch (status) {
    case kErrDtype:
      return "unsupported dtype (q: float32, float16, bfloat16; cache: q's, or float8_e4m3fn, float8_e5m2, int8)";
    case kErrScales:
      return "a quantized cache needs k_scale and v_scale (per tensor or per token and head); a float one none";
    case kErrHeadDim: return "unsupported head_dim (64, 80, 96, 128, 256)";
    case kErrAlignment: return "k_cache/v_cache must be 16-byte aligned with strides in whole 16-byte chunks";
    case kErrSharedMemory: return "the decode kernel needs more shared memory per block than this GPU has";
    case kErrGrid: return "batch and context partitions must each be at most 65535 (the CUDA grid's y/z limits)";
    case kErrBlockSize: return "block_size must be a power of two in [1, 128]";
    case kErrShape: return "inconsistent sizes (heads / kv_heads / block table / workspace)";
    default: return cudaGetErrorString(static_cast<cudaError_t>(status));
  }
}

}  // extern "C"
