// paged_attention.cu compiled by the host compiler for the CPU emulator (cuda_emulation.h):
// the kernels and launchers that run on a GPU, unchanged, run here on CPU threads.
// Built with ops.cpp into torch.ops.kvbench_emu by kernels/cuda_emulated.py.

#ifndef KVBENCH_CUDA_EMULATION
#define KVBENCH_CUDA_EMULATION
#endif
#include "paged_attention.cu"
