// paged_attention.cu's decode kernels: the cp.async ring of K/V tiles, the block's query-head tile, the
// partitioned (split-K) decode kernel, and the kernel that merges its partitions.
//
// Part of paged_attention.cu's one translation unit (nvcc's and the CPU emulator's builds compile that
// file alone): included there, after its headers, never on its own.

#pragma once

namespace {

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
  int window;  // a sliding window in tokens: keys before ctx - window masked, whole blocks before it skipped; 0: none
  const float* sinks;  // fp32 [num_heads] attention sinks (partition 0 adds them to its softmax); null: none
  int num_heads, group, head_tiles, log2_block_size, max_context, partition, max_partitions;
  int64_t q_stride_b, q_stride_h, out_stride_b, out_stride_h;
  int64_t cache_stride_block, cache_stride_token, cache_stride_head, bt_stride;
  float scale;
};

// A sliding window's first key of a context of ctx tokens (transformers' kv_idx > q_idx - window); 0 without one.
__device__ __forceinline__ int window_first(const DecodeParams& p, int ctx) {
  return p.window > 0 ? max(ctx - p.window, 0) : 0;
}

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
  // A window's first key lo; the partitions tile [lo's block start, ctx): the blocks before it are never read.
  const int lo = window_first(p, ctx);
  const int start = ((lo >> p.log2_block_size) << p.log2_block_size) + part * p.partition;
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
          if (start + row0 + r < lo) score = -INFINITY;  // in the window's first block, before the window
          prob_s[g * p.partition + row0 + r] = score;
        }
      }
    }
  };

  // 2) Softmax over the partition, one warp per query head. A sink is a key of score sink and value 0, in the
  // first partition only: it raises the max and adds exp(sink - m) to the sum, which the merge then weighs as any
  // partition's (one partition: the output's own normalisation).
  const bool sunk = p.sinks != nullptr && part == 0;
  auto softmax = [&] {
    for (int g = warp; g < heads; g += kNumWarps) {
      float* pg = prob_s + g * p.partition;
      const float sink = sunk ? p.sinks[head0 + g] : -INFINITY;
      float m = sink;
      for (int i = lane; i < n; i += kWarpSize) m = fmaxf(m, pg[i]);
      m = warp_max(m);
      float sum = 0.f;
      for (int i = lane; i < n; i += kWarpSize) {
        const float e = expf(pg[i] - m);
        pg[i] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (sunk) sum += expf(sink - m);
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
  const int first = (window_first(p, ctx) >> p.log2_block_size) << p.log2_block_size;  // as the decode's
  const int parts = (ctx - first + p.partition - 1) / p.partition;
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

}  // namespace
