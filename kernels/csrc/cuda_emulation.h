// The subset of CUDA that paged_attention.cu uses, emulated on the CPU, so that its
// kernels AND launchers run on a machine with no GPU (kernels/cuda_emulated.py builds
// them with ops.cpp into torch.ops.kvbench_emu; the tests compare them with the torch
// reference). Built only when KVBENCH_CUDA_EMULATION is defined (cuda_compat.h).
//
// How it runs a launch: every thread of a block is an OS thread, and the blocks of the
// grid run one after another, so `__shared__` (static storage here) is per block as on a
// GPU. `__syncthreads`, `__syncwarp` and the warp shuffles are real barriers among those
// threads, so a missing barrier is a real race here too, and a shuffle with a partial
// mask or lanes that diverge deadlocks instead of quietly working. Dynamic shared memory
// is filled with 0xFF (NaN as floats) before each block, so reading a value no thread
// wrote shows up in the results. A launch is checked as the driver checks it (block size,
// grid limits, dynamic shared memory against the kernel's opt-in ceiling) and its failure
// is what cudaGetLastError returns. `cp.async` is a synchronous 16-byte copy.
//
// Slow (thousands of barriers per block): for small shapes in tests only.

#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

// ---- Types and qualifiers --------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static  // one block runs at a time: a static is that block's shared memory

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };

struct __half { _Float16 v; };
struct __nv_bfloat16 { uint16_t bits; };

inline float __half2float(__half h) { return static_cast<float>(h.v); }
inline __half __float2half_rn(float f) { return __half{static_cast<_Float16>(f)}; }  // round to nearest even
inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t bits = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return __nv_bfloat16{0x7fc0};
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return __nv_bfloat16{static_cast<uint16_t>(bits >> 16)};
}

// CUDA's min/max overloads for mixed integer arguments.
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) { return a < b ? a : b; }
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }

// ---- Runtime API ------------------------------------------------------------------------

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

namespace kvb_emu {

// An H100/H200: what the launchers ask the device, and what a launch is checked against.
constexpr int kSmemOptin = 227 * 1024;
constexpr int kSmemDefault = 48 * 1024;
constexpr unsigned kMaxThreads = 1024, kMaxGridYZ = 65535;
constexpr int kWarp = 32;

inline thread_local cudaError_t last_error = cudaSuccess;
// cp.async copies land at issue and warps are skewed (see the cp.async section); set by
// launch() before any thread starts.
inline bool g_land_early = false;

inline std::mutex& attr_mutex() {
  static std::mutex m;
  return m;
}
inline std::map<const void*, int>& smem_ceiling() {  // per kernel: cudaFuncSetAttribute's value
  static std::map<const void*, int> m;
  return m;
}

}  // namespace kvb_emu

inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
// The SM count is KVBENCH_EMULATED_SMS when set (read on each query: tests vary it to
// reach every partition size), else an H200's 132.
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidValue;
  if (attr == cudaDevAttrMaxSharedMemoryPerBlockOptin) {
    *value = kvb_emu::kSmemOptin;
    return cudaSuccess;
  }
  if (attr == cudaDevAttrMultiProcessorCount) {
    const char* env = std::getenv("KVBENCH_EMULATED_SMS");
    *value = env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 132;
    return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
template <typename F>
inline cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > kvb_emu::kSmemOptin)
    return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(kvb_emu::attr_mutex());
  kvb_emu::smem_ceiling()[reinterpret_cast<const void*>(kernel)] = value;
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
  const cudaError_t err = kvb_emu::last_error;
  kvb_emu::last_error = cudaSuccess;
  return err;
}
inline const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  }
  return "unknown error";
}

// ---- Threads, barriers, shuffles -----------------------------------------------------

namespace kvb_emu {

// A reusable barrier whose party can shrink: a thread that leaves the kernel drops out,
// as an exited GPU thread no longer counts at __syncthreads.
class Barrier {
 public:
  void reset(int parties) {
    std::lock_guard<std::mutex> lock(m_);
    parties_ = parties;
    arrived_ = 0;
  }
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(m_);
    const uint64_t gen = generation_;
    if (++arrived_ >= parties_) {
      release();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
  }
  void drop() {
    std::lock_guard<std::mutex> lock(m_);
    --parties_;
    if (arrived_ > 0 && arrived_ >= parties_) release();
  }

 private:
  void release() {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
  }
  std::mutex m_;
  std::condition_variable cv_;
  int parties_ = 0, arrived_ = 0;
  uint64_t generation_ = 0;
};

struct Warp {
  Barrier barrier;
  uint64_t exchange[kWarp];
};

struct Block {
  Barrier barrier;
  std::vector<std::unique_ptr<Warp>> warps;
  unsigned char* dynamic_smem = nullptr;
};

inline thread_local Block* t_block = nullptr;
inline thread_local dim3 t_thread_idx, t_block_idx, t_block_dim, t_grid_dim;

inline unsigned linear_tid() { return t_thread_idx.x + t_block_dim.x * (t_thread_idx.y + t_block_dim.y * t_thread_idx.z); }

inline Warp& my_warp() { return *t_block->warps[linear_tid() / kWarp]; }

template <typename T, typename SrcLane>
inline T warp_exchange(unsigned mask, T v, SrcLane src_lane) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a value wider than 64 bits");
  // Every kernel here shuffles with the full mask; a partial one would need per-lane
  // bookkeeping this emulator does not do, so it is refused loudly.
  if (mask != 0xffffffffu) std::abort();
  Warp& w = my_warp();
  const int lane = static_cast<int>(linear_tid() % kWarp);
  std::memcpy(&w.exchange[lane], &v, sizeof(T));
  w.barrier.arrive_and_wait();
  T r;
  std::memcpy(&r, &w.exchange[src_lane(lane) & (kWarp - 1)], sizeof(T));
  w.barrier.arrive_and_wait();  // nobody overwrites exchange[] before every lane has read
  return r;
}

}  // namespace kvb_emu

#define threadIdx (kvb_emu::t_thread_idx)
#define blockIdx (kvb_emu::t_block_idx)
#define blockDim (kvb_emu::t_block_dim)
#define gridDim (kvb_emu::t_grid_dim)

inline void __syncthreads() {
  kvb_emu::t_block->barrier.arrive_and_wait();
  if (kvb_emu::g_land_early)  // skewed warps: warp 0 leaves first, so it runs ahead of the others
    std::this_thread::sleep_for(std::chrono::microseconds(20000 * (kvb_emu::linear_tid() / kvb_emu::kWarp)));
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) std::abort();
  kvb_emu::my_warp().barrier.arrive_and_wait();
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  return kvb_emu::warp_exchange(mask, v, [lane_mask](int lane) { return lane ^ lane_mask; });
}
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src_lane) {
  return kvb_emu::warp_exchange(mask, v, [src_lane](int) { return src_lane; });
}

// ---- cp.async ------------------------------------------------------------------------

// cp.async, as late as the hardware may be: a copy lands only when a wait needs it
// (kvb_cp_async_wait<N> completes all but this thread's newest N committed groups), so a
// kernel that reads a stage before waiting for it reads the poison or an older tile.
// With KVBENCH_EMULATED_CP_ASYNC=early (read at each launch) a copy lands as soon as it
// is issued instead, and the warps are skewed (warp w sleeps 20*w ms after each block
// barrier, so warp 0 runs ahead of the others between barriers): a kernel that
// starts a copy into a stage another warp may still be reading then overwrites it under
// that warp, as a GPU may. The tests run both.
namespace kvb_emu {

struct AsyncCopy {
  void* dst;
  const void* src;
};
inline thread_local std::vector<AsyncCopy> t_uncommitted;
inline thread_local std::vector<std::vector<AsyncCopy>> t_in_flight;  // committed groups, oldest first

inline void land_all_but(size_t newest) {
  while (t_in_flight.size() > newest) {
    for (const AsyncCopy& c : t_in_flight.front()) std::memcpy(c.dst, c.src, 16);
    t_in_flight.erase(t_in_flight.begin());
  }
}
}  // namespace kvb_emu

__device__ __forceinline__ void kvb_cp_async16(void* smem_dst, const void* gmem_src) {
  if (kvb_emu::g_land_early)
    std::memcpy(smem_dst, gmem_src, 16);
  else
    kvb_emu::t_uncommitted.push_back({smem_dst, gmem_src});
}
__device__ __forceinline__ void kvb_cp_async_commit() {
  kvb_emu::t_in_flight.push_back(std::move(kvb_emu::t_uncommitted));
  kvb_emu::t_uncommitted.clear();
}
template <int N>
__device__ __forceinline__ void kvb_cp_async_wait() {
  kvb_emu::land_all_but(N);
}

// ---- Launch ------------------------------------------------------------------------------

namespace kvb_emu {

// Runs kernel(args...) over the grid as the driver would, or records why it would not launch.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t, Args... args) {
  const unsigned threads = block.x * block.y * block.z;
  int ceiling = kSmemDefault;
  {
    std::lock_guard<std::mutex> lock(attr_mutex());
    const auto it = smem_ceiling().find(reinterpret_cast<const void*>(kernel));
    if (it != smem_ceiling().end()) ceiling = it->second;
  }
  if (threads == 0 || threads > kMaxThreads || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > kMaxGridYZ ||
      grid.z > kMaxGridYZ) {
    last_error = cudaErrorInvalidConfiguration;
    return;
  }
  if (smem > static_cast<size_t>(ceiling)) {
    last_error = cudaErrorInvalidValue;
    return;
  }
  const char* landing = std::getenv("KVBENCH_EMULATED_CP_ASYNC");
  g_land_early = landing != nullptr && std::string(landing) == "early";
  Block state;
  state.warps.resize((threads + kWarp - 1) / kWarp);
  for (unsigned w = 0; w < state.warps.size(); ++w) {
    state.warps[w] = std::make_unique<Warp>();
    state.warps[w]->barrier.reset(static_cast<int>(std::min<unsigned>(kWarp, threads - w * kWarp)));
  }
  std::vector<unsigned char> dynamic(smem + 16);
  unsigned char* base = dynamic.data() + (16 - reinterpret_cast<uintptr_t>(dynamic.data()) % 16) % 16;
  state.dynamic_smem = base;
  Barrier block_end;
  block_end.reset(static_cast<int>(threads));
  const auto prepare_block = [&] {  // by one thread, while every other waits
    state.barrier.reset(static_cast<int>(threads));
    std::memset(base, 0xff, smem);  // NaN: a value read before any thread wrote it shows
  };
  prepare_block();
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      t_block = &state;
      t_block_dim = block;
      t_grid_dim = grid;
      t_thread_idx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
      for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
          for (unsigned x = 0; x < grid.x; ++x) {
            t_block_idx = dim3(x, y, z);
            kernel(args...);
            // A copy never waited for still lands (before the next block reuses the memory).
            kvb_cp_async_commit();
            kvb_emu::land_all_but(0);
            state.barrier.drop();  // this thread has left the block
            block_end.arrive_and_wait();
            if (t == 0) prepare_block();
            block_end.arrive_and_wait();
          }
      t_block = nullptr;
    });
  }
  for (auto& th : pool) th.join();
}

inline unsigned char* dynamic_smem() { return t_block->dynamic_smem; }

}  // namespace kvb_emu

// ---- What cuda_compat.h maps its macros to ------------------------------------------

#define KVB_LAUNCH(kernel, grid, block, smem, stream, ...) \
  kvb_emu::launch(kernel, grid, block, smem, stream, __VA_ARGS__)
#define KVB_DYNAMIC_SMEM(type, name) type* name = reinterpret_cast<type*>(kvb_emu::dynamic_smem())
