// What paged_attention.cu needs from CUDA, in one place, so the same source also builds
// for the CPU emulator (cuda_emulation.h, when KVBENCH_CUDA_EMULATION is defined):
// - the CUDA headers (or their emulated types and runtime calls);
// - KVB_LAUNCH(kernel, grid, block, smem, stream, args...): a kernel launch;
// - KVB_DYNAMIC_SMEM(type, name): the block's dynamic shared memory as `type* name`;
// - kvb_cp_async16 / kvb_cp_async_commit / kvb_cp_async_wait<N>: 16-byte copies from
//   global to shared memory that do not hold registers while in flight (sm_80+), so a
//   block keeps many bytes in flight; a plain copy on older GPUs. The "memory" clobbers
//   keep the compiler from moving shared-memory reads and writes across them.

#pragma once

#ifdef KVBENCH_CUDA_EMULATION
#include "cuda_emulation.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define KVB_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#define KVB_DYNAMIC_SMEM(type, name) \
  extern __shared__ __align__(16) unsigned char kvb_dynamic_smem_[]; \
  type* name = reinterpret_cast<type*>(kvb_dynamic_smem_)

__device__ __forceinline__ void kvb_cp_async16(void* smem_dst, const void* gmem_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
#else
  *static_cast<uint4*>(smem_dst) = *static_cast<const uint4*>(gmem_src);
#endif
}

__device__ __forceinline__ void kvb_cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void kvb_cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
#endif
