// The vector instruction set kvbench's CPU op library (kernels/dense_op.py) runs, chosen once per
// process: AVX-512 where the CPU has it, else AVX2 with FMA, else portable C++.
// KVBENCH_GEMM_ISA=avx2|portable picks a narrower path than the CPU allows, so that the tests run every
// path on one machine (tests/unit/kernels/test_dense_op_gemm.py). Defined in packed_gemm_cpu.cpp.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KVBENCH_X86 1
#endif

namespace kvbench_cpu {

enum class Isa { kPortable, kAvx2, kAvx512 };

Isa library_isa();

}  // namespace kvbench_cpu
