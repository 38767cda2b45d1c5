// paged_attention.cu's device basics: launch shape, status codes, dtype conversions, how a warp lays
// 16-byte loads over a row, and warp- and block-wide reductions.
//
// Part of paged_attention.cu's one translation unit (nvcc's and the CPU emulator's builds compile that
// file alone): included there, after its headers, never on its own.

#pragma once

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

}  // namespace
