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

namespace {

constexpr int kWarpSize = 32;
constexpr int kNumThreads = 128;
constexpr int kNumWarps = kNumThreads / kWarpSize;
constexpr int kMaxPartition = 512;  // tokens per block at most; longer contexts take the split-K path
constexpr int kMinPartition = 128;  // the least a partition shrinks to: a multiple of every block size
constexpr int kBlocksPerSm = 4;     // partitions shrink until the grid has this many blocks per SM
constexpr int kMaxHeadTile = 8;      // query heads one block serves at most (bounds its accumulators)
constexpr unsigned kFullMask = 0xffffffffu;

// Status codes beside cudaError_t values (which are >= 0).
constexpr int kErrDtype = -1;
constexpr int kErrHeadDim = -2;
constexpr int kErrAlignment = -3;
constexpr int kErrSharedMemory = -4;
constexpr int kErrBlockSize = -5;
constexpr int kErrShape = -6;
constexpr int kErrGrid = -7;
constexpr int kErrScales = -8;

enum DType { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(kvbench_quant::Fp8E4M3 x) { return kvbench_quant::to_float_q(x); }
__device__ __forceinline__ float to_float(kvbench_quant::Fp8E5M2 x) { return kvbench_quant::to_float_q(x); }
__device__ __forceinline__ float to_float(int8_t x) { return kvbench_quant::to_float_q(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// The smallest power of two >= chunks, at most a warp.
constexpr int lanes_for(int chunks) { return chunks > 16 ? 32 : chunks > 8 ? 16 : chunks > 4 ? 8 : chunks > 2 ? 4 : chunks > 1 ? 2 : 1; }

// How a warp covers head_dim rows (in shared memory) with 16-byte loads: kLanes lanes
// per row (a power of two, at most MAX_LANES), kRowsPerWarp rows at once, kChunks
// 16-byte chunks per row. Consecutive lanes read consecutive chunks of a row, so a
// quarter-warp reads 128 contiguous bytes: no bank conflicts.
template <typename T, int HEAD_DIM, int MAX_LANES = kWarpSize>
struct RowLayout {
  using Elem = T;
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  static_assert(HEAD_DIM % kVec == 0, "a head_dim row must be whole 16-byte chunks");
  static constexpr int kChunks = HEAD_DIM / kVec;
  static constexpr int kLanes = lanes_for(kChunks) < MAX_LANES ? lanes_for(kChunks) : MAX_LANES;
  static constexpr int kChunksPerLane = (kChunks + kLanes - 1) / kLanes;
  static constexpr int kElems = kChunksPerLane * kVec;  // floats a lane holds for one row
  static constexpr int kRowsPerWarp = kWarpSize / kLanes;
};

// Loads this lane's chunks of one row as floats (zeros for chunks past the row).
template <typename L>
__device__ __forceinline__ void load_row(const typename L::Elem* __restrict__ row, int lane_in_row,
                                         float (&dst)[L::kElems]) {
  using T = typename L::Elem;
#pragma unroll
  for (int j = 0; j < L::kChunksPerLane; ++j) {
    const int c = lane_in_row + j * L::kLanes;
    if (c < L::kChunks) {
      const uint4 raw = *reinterpret_cast<const uint4*>(row + c * L::kVec);
      const T* vals = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) dst[j * L::kVec + e] = to_float(vals[e]);
    } else {
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) dst[j * L::kVec + e] = 0.f;
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// Every thread gets the block-wide result; scratch holds kNumWarps floats.
template <bool IS_MAX>
__device__ float block_reduce(float v, float* scratch) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  v = IS_MAX ? warp_max(v) : warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
#pragma unroll
  for (int w = 1; w < kNumWarps; ++w) r = IS_MAX ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();  // scratch may be reused right after
  return r;
}

struct DecodeParams {
  void* out;           // [batch, heads, head_dim] of T
  float* part_out;     // split-K only: [batch, heads, max_partitions, head_dim]
  float* part_max;     // split-K only: [batch, heads, max_partitions]
  float* part_sum;     // split-K only: [batch, heads, max_partitions]
  const void* q;
  const void* k_cache;
  const void* v_cache;
  const int32_t* block_tables;
  const int32_t* context_lens;
  const float* k_scale;  // a quantized cache's (kv_quant.h scale_mode); null for a float cache
  const float* v_scale;
  int scale_mode, kv_heads;
  int num_heads, group, head_tiles, log2_block_size, max_context, partition, max_partitions;
  int64_t q_stride_b, q_stride_h, out_stride_b, out_stride_h;
  int64_t cache_stride_block, cache_stride_token, cache_stride_head, bt_stride;
  float scale;
};

// How a block streams K and V through shared memory: tiles of kRows token rows, kStages
// of them in a ring filled by cp.async, so each block has (kStages - 1) tiles (up to
// 24 KB) in flight while it computes on one, without holding them in registers.
template <typename T, int HEAD_DIM, int HEADS>
struct Tiles {
  static constexpr int kRowBytes = HEAD_DIM * static_cast<int>(sizeof(T));
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks per row
  static constexpr int kRowsWanted = 8192 / kRowBytes;  // ~8 KB per tile
  // At least 16 rows: the score pass covers 16 rows at once (4 warps x 4 rows of 8 lanes).
  static constexpr int kRows = kRowsWanted > 32 ? 32 : kRowsWanted < 16 ? 16 : kRowsWanted;
  static constexpr int kStages = 4;
  static constexpr int kTileBytes = kRows * kRowBytes;
  static constexpr int kRingBytes = kStages * kTileBytes;
  // The cross-warp sum of the outputs reuses the ring once every tile is consumed.
  static constexpr int kReduceBytes = kNumWarps * HEADS * HEAD_DIM * 4;
  static constexpr int kRegionBytes = kRingBytes > kReduceBytes ? kRingBytes : kReduceBytes;
};

// Shared memory of the decode kernel, in bytes, all of it dynamic: the ring (or the
// reduction), q for HEADS heads, the probabilities [heads][partition], 1/sum per head, and
// the partition's block ids (at most one per token, at block size 1).
template <typename T, int HEAD_DIM, int HEADS>
__host__ __device__ constexpr int decode_smem_bytes(int heads, int partition) {
  return Tiles<T, HEAD_DIM, HEADS>::kRegionBytes + 4 * (HEADS * HEAD_DIM + heads * partition + HEADS + partition);
}

// The query heads a block serves for a GQA group: the group (at most kMaxHeadTile), rounded
// up to a power of two so HEADS takes one of four values; and how many such tiles a group has.
int heads_per_block(int group) {
  const int g = group < kMaxHeadTile ? group : kMaxHeadTile;
  return g > 4 ? 8 : g > 2 ? 4 : g;
}
int head_tiles_for(int group) { return (group + heads_per_block(group) - 1) / heads_per_block(group); }

// One block: a (kv_head, query-head tile of up to HEADS heads, sequence, partition).
// The partition's K tiles and then its V tiles go through one cp.async ring; the
// softmax runs between them while the first V tiles are already in flight.
// T: q and out; C: the cache's elements (T itself, or a one-byte quantized format).
template <typename T, typename C, int HEAD_DIM, int HEADS>
__global__ void __launch_bounds__(kNumThreads) paged_decode_kernel(const DecodeParams p) {
  using TL = Tiles<C, HEAD_DIM, HEADS>;
  using L = RowLayout<C, HEAD_DIM>;      // V rows: many lanes per row, few accumulators per lane
  using LK = RowLayout<C, HEAD_DIM, 8>;  // K rows: few lanes per row, a short shuffle sum per score
  constexpr bool kQuant = sizeof(C) == 1;
  const int kv_head = blockIdx.x / p.head_tiles, head_tile = blockIdx.x % p.head_tiles;
  const int seq = blockIdx.y, part = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int g_first = head_tile * HEADS;
  const int heads = min(HEADS, p.group - g_first);  // query heads of this block
  const int head0 = kv_head * p.group + g_first;
  const bool split = p.part_out != nullptr;
  // Clamped so a bad length cannot read past the block table (the CPU op raises instead).
  const int ctx = min(p.context_lens[seq], p.max_context);
  const int start = part * p.partition;
  T* out = static_cast<T*>(p.out) + seq * p.out_stride_b + head0 * p.out_stride_h;
  if (ctx <= 0) {  // nothing to attend to: zeros, not 0/0
    if (!split && part == 0)
      for (int i = tid; i < heads * HEAD_DIM; i += kNumThreads)
        out[(i / HEAD_DIM) * p.out_stride_h + i % HEAD_DIM] = from_float<T>(0.f);
    return;
  }
  if (start >= ctx) return;  // the merge kernel reads only live partitions
  const int n = min(ctx - start, p.partition);

  KVB_DYNAMIC_SMEM(unsigned char, smem);
  unsigned char* ring = smem;                                        // [kStages][kRows][kRowBytes]
  float* red_s = reinterpret_cast<float*>(smem);                     // after the ring: [warps][HEADS][HEAD_DIM]
  float* q_s = reinterpret_cast<float*>(smem + TL::kRegionBytes);    // [HEADS][HEAD_DIM]
  float* prob_s = q_s + HEADS * HEAD_DIM;                        // [heads][p.partition]
  float* inv_sum_s = prob_s + heads * p.partition;                   // [HEADS]
  int32_t* table_s = reinterpret_cast<int32_t*>(inv_sum_s + HEADS);  // [blocks of the partition]

  const T* q = static_cast<const T*>(p.q) + seq * p.q_stride_b + head0 * p.q_stride_h;
  for (int i = tid; i < heads * HEAD_DIM; i += kNumThreads)
    q_s[i] = to_float(q[(i / HEAD_DIM) * p.q_stride_h + i % HEAD_DIM]) * p.scale;
  // The partition's block ids, staged once: a row's address then needs no dependent global
  // load (partitions start on a block boundary: a partition is a multiple of every block size).
  const int32_t* table = p.block_tables + seq * p.bt_stride + (start >> p.log2_block_size);
  const int num_blocks = (n + (1 << p.log2_block_size) - 1) >> p.log2_block_size;
  for (int i = tid; i < num_blocks; i += kNumThreads) table_s[i] = table[i];
  __syncthreads();  // publishes q_s and table_s

  const int block_mask = (1 << p.log2_block_size) - 1;
  const int64_t head_offset = kv_head * p.cache_stride_head;
  const int num_tiles = (n + TL::kRows - 1) / TL::kRows;  // of K, then as many of V
  const int stream_len = 2 * num_tiles;
  // A quantized cache's scale of partition row t: its (block, token, kv head)'s, or the layer's.
  const bool dynamic = kQuant && p.scale_mode == kvbench_quant::kScaleTokenHead;
  auto row_scale = [&](const float* scales, int t) {
    if (!dynamic) return scales[0];
    const int64_t block = table_s[t >> p.log2_block_size];
    const int64_t slot = (block << p.log2_block_size) + (t & block_mask);
    return scales[slot * p.kv_heads + kv_head];
  };

  // Starts the copy of stream item i (K tile i, or V tile i - num_tiles) into its stage.
  // Rows past the context are not copied; nothing reads them.
  auto issue = [&](int i) {
    const bool is_v = i >= num_tiles;
    const C* cache = static_cast<const C*>(is_v ? p.v_cache : p.k_cache);
    const int row0 = (is_v ? i - num_tiles : i) * TL::kRows;
    unsigned char* dst = ring + (i % TL::kStages) * TL::kTileBytes;
    for (int c = tid; c < TL::kRows * TL::kChunks; c += kNumThreads) {
      const int r = c / TL::kChunks, chunk = c % TL::kChunks, t = row0 + r;
      if (t < n) {
        const int64_t row = static_cast<int64_t>(table_s[t >> p.log2_block_size]) * p.cache_stride_block +
                            (t & block_mask) * p.cache_stride_token + head_offset;
        kvb_cp_async16(dst + r * TL::kRowBytes + chunk * 16, cache + row + chunk * (16 / sizeof(C)));
      }
    }
  };

  // 1) Scores of one K tile: few lanes per row (LK), so a score's cross-lane sum is
  // log2(lanes) shuffles; a lane loads all its rows of the tile first, so each q value
  // read from shared memory serves kRowsPerLane rows. Every lane of a warp runs the same
  // trip counts: the shuffles stay converged.
  auto scores = [&](const C* tile, int row0) {
    constexpr int kRowStep = kNumWarps * LK::kRowsPerWarp;
    constexpr int kRowsPerLane = (TL::kRows + kRowStep - 1) / kRowStep;
    const int row_in_warp = lane / LK::kLanes, lane_in_row = lane % LK::kLanes;
    const int r0 = warp * LK::kRowsPerWarp + row_in_warp;
    float k[kRowsPerLane][LK::kElems];
#pragma unroll
    for (int u = 0; u < kRowsPerLane; ++u) {
      const int r = r0 + u * kRowStep;
      if (r < TL::kRows && row0 + r < n) {
        load_row<LK>(tile + r * HEAD_DIM, lane_in_row, k[u]);
      } else {
#pragma unroll
        for (int e = 0; e < LK::kElems; ++e) k[u][e] = 0.f;
      }
    }
    for (int g = 0; g < heads; ++g) {
      const float* qg = q_s + g * HEAD_DIM;
      float s[kRowsPerLane];
#pragma unroll
      for (int u = 0; u < kRowsPerLane; ++u) s[u] = 0.f;
#pragma unroll
      for (int j = 0; j < LK::kChunksPerLane; ++j) {
        const int c = lane_in_row + j * LK::kLanes;
        if (c < LK::kChunks) {
#pragma unroll
          for (int e = 0; e < LK::kVec; e += 4) {  // 16-byte shared-memory reads
            const float4 qv = *reinterpret_cast<const float4*>(qg + c * LK::kVec + e);
#pragma unroll
            for (int u = 0; u < kRowsPerLane; ++u) {
              const float* kv = k[u] + j * LK::kVec + e;
              s[u] += qv.x * kv[0] + qv.y * kv[1] + qv.z * kv[2] + qv.w * kv[3];
            }
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kRowsPerLane; ++u) {
#pragma unroll
        for (int off = LK::kLanes / 2; off > 0; off >>= 1) s[u] += __shfl_xor_sync(kFullMask, s[u], off);
        const int r = r0 + u * kRowStep;
        if (r < TL::kRows && row0 + r < n && lane_in_row == 0) {
          float score = s[u];
          if constexpr (kQuant) score *= row_scale(p.k_scale, row0 + r);
          prob_s[g * p.partition + row0 + r] = score;
        }
      }
    }
  };

  // 2) Softmax over the partition, one warp per query head.
  auto softmax = [&] {
    for (int g = warp; g < heads; g += kNumWarps) {
      float* pg = prob_s + g * p.partition;
      float m = -INFINITY;
      for (int i = lane; i < n; i += kWarpSize) m = fmaxf(m, pg[i]);
      m = warp_max(m);
      float sum = 0.f;
      for (int i = lane; i < n; i += kWarpSize) {
        const float e = expf(pg[i] - m);
        pg[i] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        inv_sum_s[g] = 1.f / sum;
        if (split) {
          const int64_t idx = (static_cast<int64_t>(seq) * p.num_heads + head0 + g) * p.max_partitions + part;
          p.part_max[idx] = m;
          p.part_sum[idx] = sum;
        }
      }
    }
  };

  // 3) probs @ V of one V tile into this lane's accumulators: many lanes per row (L), so
  // a lane owns few output elements; row groups and warps are summed once, at the end.
  const int v_row_in_warp = lane / L::kLanes, v_lane_in_row = lane % L::kLanes;
  auto accumulate = [&](float (&acc)[HEADS][L::kElems], const C* tile, int row0) {
    constexpr int kRowStep = kNumWarps * L::kRowsPerWarp;
    for (int r = warp * L::kRowsPerWarp + v_row_in_warp; r < TL::kRows; r += kRowStep) {
      const int t = row0 + r;
      if (t >= n) break;  // rows only grow
      float v[L::kElems];
      load_row<L>(tile + r * HEAD_DIM, v_lane_in_row, v);
      float v_row_scale = 1.f;  // per token and kv head: folded into the row's probabilities
      if constexpr (kQuant) {
        if (dynamic) v_row_scale = row_scale(p.v_scale, t);
      }
#pragma unroll
      for (int g = 0; g < HEADS; ++g) {
        if (g < heads) {
          float pr = prob_s[g * p.partition + t];
          if constexpr (kQuant) pr *= v_row_scale;
#pragma unroll
          for (int e = 0; e < L::kElems; ++e) acc[g][e] += pr * v[e];
        }
      }
    }
  };

  // The ring: item i is consumed at iteration i, and its copy was started kStages - 1
  // iterations earlier. One group is committed per iteration (empty past the end), so
  // waiting until kStages - 2 groups are pending means this thread's copies of item i
  // landed; the barrier then publishes every thread's, and also says every thread is done
  // with item i - 1, whose stage the copy started next (item i + kStages - 1) reuses.
  // The K and V items run in two loops, so the V accumulators are not live in the first.
#pragma unroll
  for (int s = 0; s < TL::kStages - 1; ++s) {
    if (s < stream_len) issue(s);
    kvb_cp_async_commit();
  }
  auto next = [&](int i) {  // item i's tile, once every thread's copy of it has landed
    kvb_cp_async_wait<TL::kStages - 2>();
    __syncthreads();
    if (i + TL::kStages - 1 < stream_len) issue(i + TL::kStages - 1);
    kvb_cp_async_commit();
    return reinterpret_cast<const C*>(ring + (i % TL::kStages) * TL::kTileBytes);
  };
  for (int i = 0; i < num_tiles; ++i) scores(next(i), i * TL::kRows);
  float acc[HEADS][L::kElems];
#pragma unroll
  for (int g = 0; g < HEADS; ++g)
#pragma unroll
    for (int e = 0; e < L::kElems; ++e) acc[g][e] = 0.f;
  for (int i = num_tiles; i < stream_len; ++i) {
    const C* tile = next(i);
    if (i == num_tiles) {  // every score is in prob_s (the barrier in next)
      softmax();
      __syncthreads();
    }
    accumulate(acc, tile, (i - num_tiles) * TL::kRows);
  }
  kvb_cp_async_wait<0>();
  __syncthreads();  // the ring is free: red_s takes it

  // Sum the row groups of a warp (shuffles), then the warps (shared memory).
#pragma unroll
  for (int g = 0; g < HEADS; ++g) {
    if (g < heads) {  // uniform across the block: shuffles stay converged
#pragma unroll
      for (int e = 0; e < L::kElems; ++e)
#pragma unroll
        for (int off = L::kLanes; off < kWarpSize; off <<= 1) acc[g][e] += __shfl_xor_sync(kFullMask, acc[g][e], off);
    }
  }
  if (v_row_in_warp == 0) {
#pragma unroll
    for (int g = 0; g < HEADS; ++g) {
#pragma unroll
      for (int j = 0; j < L::kChunksPerLane; ++j) {
        const int c = v_lane_in_row + j * L::kLanes;
        if (g < heads && c < L::kChunks) {
#pragma unroll
          for (int e = 0; e < L::kVec; ++e)
            red_s[(warp * HEADS + g) * HEAD_DIM + c * L::kVec + e] = acc[g][j * L::kVec + e];
        }
      }
    }
  }
  __syncthreads();
  for (int i = tid; i < heads * HEAD_DIM; i += kNumThreads) {
    const int g = i / HEAD_DIM, d = i % HEAD_DIM;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kNumWarps; ++w) s += red_s[(w * HEADS + g) * HEAD_DIM + d];
    s *= inv_sum_s[g];
    if constexpr (kQuant) {
      if (!dynamic) s *= p.v_scale[0];  // per tensor: the layer's V scale, once per output
    }
    if (split) {
      const int64_t row = (static_cast<int64_t>(seq) * p.num_heads + head0 + g) * p.max_partitions + part;
      p.part_out[row * HEAD_DIM + d] = s;
    } else {
      out[g * p.out_stride_h + d] = from_float<T>(s);
    }
  }
}

// Split-K merge: weight each partition's normalised output by sum_p * exp(max_p - max).
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(kNumThreads) merge_partitions_kernel(const DecodeParams p) {
  const int head = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
  const int ctx = min(p.context_lens[seq], p.max_context);
  T* out = static_cast<T*>(p.out) + seq * p.out_stride_b + head * p.out_stride_h;
  if (ctx <= 0) {
    for (int d = tid; d < HEAD_DIM; d += kNumThreads) out[d] = from_float<T>(0.f);
    return;
  }
  const int parts = (ctx + p.partition - 1) / p.partition;
  KVB_DYNAMIC_SMEM(float, smem);
  float* weight_s = smem;  // [max_partitions]
  float* scratch = smem + p.max_partitions;
  const int64_t base = (static_cast<int64_t>(seq) * p.num_heads + head) * p.max_partitions;

  float m = -INFINITY;
  for (int i = tid; i < parts; i += kNumThreads) m = fmaxf(m, p.part_max[base + i]);
  m = block_reduce<true>(m, scratch);
  float total = 0.f;
  for (int i = tid; i < parts; i += kNumThreads) {
    const float w = p.part_sum[base + i] * expf(p.part_max[base + i] - m);
    weight_s[i] = w;
    total += w;
  }
  total = block_reduce<false>(total, scratch);  // its barrier also publishes weight_s
  const float inv_total = 1.f / total;
  const float* part_out = p.part_out + base * HEAD_DIM;
  for (int d = tid; d < HEAD_DIM; d += kNumThreads) {
    float s = 0.f;
    for (int i = 0; i < parts; ++i) s += weight_s[i] * part_out[i * HEAD_DIM + d];
    out[d] = from_float<T>(s * inv_total);
  }
}

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
                                   float scale, cudaStream_t stream) {
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
