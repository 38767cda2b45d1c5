// torch.ops.kvbench_dense.packed_linear: y = x W^T (+ bias) for the few rows of a decode step, on a CPU.
//
// A decode step's GEMMs have 1-64 rows and weights far larger than the caches, so each weight is
// streamed from DRAM once a step while each of its elements feeds a handful of multiply-adds.
// Measured on a 2-core AMD EPYC (Zen 4), fp32, one thread, a 58M Llama's weights (166 MB) a step:
// oneDNN's inner product on pre-packed weights ran 13.1 ms at 8 rows, as fast as its arithmetic
// allows only when the weight sat in cache; streamed, its loads and its FMAs took turns. This
// kernel keeps both busy:
//
// - The weight is packed once into panels of 16 output columns, ``[ceil(N/16), K, 16]``, so one
//   step reads it as one sequential stream, a 64-byte line per k.
// - For a block of MR rows the MR x 16 outputs stay in registers across the whole K loop (one
//   AVX-512 register or two AVX2 ones per row), one broadcast of x and one FMA per row and k.
// - Software prefetch runs kPrefetchLines lines ahead of the loads, into the next panel at the
//   end of one, so DRAM keeps streaming while the FMAs run (8 rows: 13.1 -> 11.0 ms a step).
//
// Each output is one FMA chain over k = 0 .. K-1 whatever the batch, so a row's result does not
// depend on which rows share its step. The instruction set is chosen at run time (AVX-512F, else
// AVX2 + FMA, else a portable loop with the same order of operations less the fusing).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "cpu_isa.h"

namespace {

constexpr int64_t kPanel = 16;         // output columns per panel: one 512-bit register of floats
constexpr int64_t kPrefetchLines = 64;  // 4 KiB ahead: measured best among 32-512 lines at 8 and 32 rows

void check_float_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, "kvbench_dense: ", name,
              " must be a float32 CPU tensor, got ", t.scalar_type(), " on ", t.device());
  TORCH_CHECK(t.is_contiguous(), "kvbench_dense: ", name, " must be contiguous");
}

at::Tensor pack_linear_weight(const at::Tensor& w) {
  check_float_cpu(w, "weight");
  TORCH_CHECK(w.dim() == 2, "kvbench_dense::pack_linear_weight: weight must be [N, K], got ", w.sizes());
  const int64_t n = w.size(0), k = w.size(1), panels = (n + kPanel - 1) / kPanel;
  at::Tensor packed = at::zeros({panels, k, kPanel}, w.options());  // the last panel's spare columns stay 0
  const float* src = w.const_data_ptr<float>();
  float* dst = packed.mutable_data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t c = 0; c < kPanel && p * kPanel + c < n; ++c) {
        const float* row = src + (p * kPanel + c) * k;
        for (int64_t i = 0; i < k; ++i) dst[(p * k + i) * kPanel + c] = row[i];
      }
  });
  return packed;
}

// One panel's outputs for rows [0, mr) of x: y[r][c] = sum_i x[r][i] * panel[i][c] (+ bias[c]).
struct Block {
  const float* x;
  int64_t ldx;
  const float* panel;
  int64_t k;
  float* y;
  int64_t ldy;
  int64_t cols;  // valid columns of this panel (16 but in the last)
  const float* bias;  // this panel's bias, or null
};

void block_portable(const Block& b, int64_t mr) {
  for (int64_t r = 0; r < mr; ++r) {
    float acc[kPanel] = {};
    for (int64_t i = 0; i < b.k; ++i) {
      const float a = b.x[r * b.ldx + i];
      for (int64_t c = 0; c < kPanel; ++c) acc[c] += a * b.panel[i * kPanel + c];
    }
    for (int64_t c = 0; c < b.cols; ++c) b.y[r * b.ldy + c] = b.bias ? acc[c] + b.bias[c] : acc[c];
  }
}

#ifdef KVBENCH_X86
template <int MR>
__attribute__((target("avx512f"))) void block_avx512(const Block& b) {
  __m512 acc[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < b.k; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(b.panel + (i + kPrefetchLines) * kPanel), _MM_HINT_T0);
    const __m512 w = _mm512_loadu_ps(b.panel + i * kPanel);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(b.x[r * b.ldx + i]), w, acc[r]);
  }
  const __mmask16 mask = b.cols == kPanel ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << b.cols) - 1);
  const __m512 bias = b.bias ? _mm512_maskz_loadu_ps(mask, b.bias) : _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    _mm512_mask_storeu_ps(b.y + r * b.ldy, mask, b.bias ? _mm512_add_ps(acc[r], bias) : acc[r]);
}

// Two adjacent panels at once (32 columns): each broadcast of x feeds two FMAs, which halves the
// broadcasts per FMA; 12 rows x 2 accumulators + 2 weights + 1 broadcast fit the 32 registers.
template <int MR>
__attribute__((target("avx512f"))) void block_avx512_pair(const Block& b, const Block& b2) {
  __m512 acc[MR], acc2[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) acc[r] = acc2[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < b.k; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(b.panel + (i + kPrefetchLines) * kPanel), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(b2.panel + (i + kPrefetchLines) * kPanel), _MM_HINT_T0);
    const __m512 w = _mm512_loadu_ps(b.panel + i * kPanel), w2 = _mm512_loadu_ps(b2.panel + i * kPanel);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(b.x[r * b.ldx + i]);
      acc[r] = _mm512_fmadd_ps(a, w, acc[r]);
      acc2[r] = _mm512_fmadd_ps(a, w2, acc2[r]);
    }
  }
  const __mmask16 mask2 = b2.cols == kPanel ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << b2.cols) - 1);
  const __m512 bias = b.bias ? _mm512_loadu_ps(b.bias) : _mm512_setzero_ps();
  const __m512 bias2 = b2.bias ? _mm512_maskz_loadu_ps(mask2, b2.bias) : _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(b.y + r * b.ldy, b.bias ? _mm512_add_ps(acc[r], bias) : acc[r]);
    _mm512_mask_storeu_ps(b2.y + r * b2.ldy, mask2, b2.bias ? _mm512_add_ps(acc2[r], bias2) : acc2[r]);
  }
}

__attribute__((target("avx2,fma"))) void store_avx2(__m256 lo, __m256 hi, const Block& b, float* y) {
  if (b.bias) {
    alignas(32) float bias[kPanel] = {};
    for (int64_t c = 0; c < b.cols; ++c) bias[c] = b.bias[c];
    lo = _mm256_add_ps(lo, _mm256_load_ps(bias));
    hi = _mm256_add_ps(hi, _mm256_load_ps(bias + 8));
  }
  if (b.cols == kPanel) {
    _mm256_storeu_ps(y, lo);
    _mm256_storeu_ps(y + 8, hi);
    return;
  }
  alignas(32) float out[kPanel];
  _mm256_store_ps(out, lo);
  _mm256_store_ps(out + 8, hi);
  for (int64_t c = 0; c < b.cols; ++c) y[c] = out[c];
}

template <int MR>
__attribute__((target("avx2,fma"))) void block_avx2(const Block& b) {
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < b.k; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(b.panel + (i + kPrefetchLines) * kPanel), _MM_HINT_T0);
    const __m256 w0 = _mm256_loadu_ps(b.panel + i * kPanel), w1 = _mm256_loadu_ps(b.panel + i * kPanel + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(b.x + r * b.ldx + i);
      acc[r][0] = _mm256_fmadd_ps(a, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) store_avx2(acc[r][0], acc[r][1], b, b.y + r * b.ldy);
}

// Rows in blocks of MAX (the registers' limit: 12 x 1 AVX-512 accumulators, 6 x 2 AVX2 ones),
// the remainder in one smaller block. Templates need compile-time sizes: a table per ISA.
template <template <int> class K, int... Rs>
struct Table {
  static constexpr void (*fns[])(const Block&) = {K<Rs>::run...};
};
template <int MR> struct Avx512 { static void run(const Block& b) { block_avx512<MR>(b); } };
template <int MR> struct Avx512Pair {
  static void run(const Block& b, const Block& b2) { block_avx512_pair<MR>(b, b2); }
};
template <template <int> class K, int... Rs>
struct PairTable {
  static constexpr void (*fns[])(const Block&, const Block&) = {K<Rs>::run...};
};
using Avx512PairTable = PairTable<Avx512Pair, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12>;
template <int MR> struct Avx2 { static void run(const Block& b) { block_avx2<MR>(b); } };
using Avx512Table = Table<Avx512, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12>;
using Avx2Table = Table<Avx2, 1, 2, 3, 4, 5, 6>;
#endif

using kvbench_cpu::Isa;

const Isa kIsa = kvbench_cpu::library_isa();

// Rows [0, m) of two adjacent panels, the first of them full (AVX-512 only).
void panel_pair_rows(const Block& b, const Block& b2, int64_t m) {
#ifdef KVBENCH_X86
  for (int64_t r = 0; r < m; r += 12) {
    const int64_t mr = std::min<int64_t>(12, m - r);
    Block part = b, part2 = b2;
    part.x = part2.x = b.x + r * b.ldx;
    part.y = b.y + r * b.ldy;
    part2.y = b2.y + r * b2.ldy;
    Avx512PairTable::fns[mr - 1](part, part2);
  }
#else
  (void)b, (void)b2, (void)m;
#endif
}

void panel_rows(Block b, int64_t m) {
#ifdef KVBENCH_X86
  const int64_t most = kIsa == Isa::kAvx512 ? 12 : 6;
  for (int64_t r = 0; r < m; r += most) {
    const int64_t mr = std::min(most, m - r);
    Block part = b;
    part.x = b.x + r * b.ldx;
    part.y = b.y + r * b.ldy;
    if (kIsa == Isa::kAvx512) {
      Avx512Table::fns[mr - 1](part);
    } else if (kIsa == Isa::kAvx2) {
      Avx2Table::fns[mr - 1](part);
    } else {
      block_portable(part, mr);
    }
  }
#else
  block_portable(b, m);
#endif
}

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                         const std::optional<at::Tensor>& bias) {
  check_float_cpu(x, "x");
  check_float_cpu(packed, "packed weight");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.size(2) == kPanel && packed.size(1) == x.size(1) &&
                  packed.size(0) == (n + kPanel - 1) / kPanel,
              "kvbench_dense::packed_linear: x ", x.sizes(), " and packed weight ", packed.sizes(),
              " are not [M, K] and [ceil(", n, " / 16), K, 16]");
  if (bias) {
    check_float_cpu(*bias, "bias");
    TORCH_CHECK(bias->numel() == n, "kvbench_dense::packed_linear: bias has ", bias->numel(), " elements, not ", n);
  }
  const int64_t m = x.size(0), k = x.size(1), panels = packed.size(0);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m == 0 || n == 0) return y;
  const float* xp = x.const_data_ptr<float>();
  const float* wp = packed.const_data_ptr<float>();
  const float* bp = bias ? bias->const_data_ptr<float>() : nullptr;
  float* yp = y.mutable_data_ptr<float>();
  auto block_of = [&](int64_t p) {
    return Block{xp, k, wp + p * k * kPanel, k, yp + p * kPanel, n, std::min(kPanel, n - p * kPanel),
                 bp ? bp + p * kPanel : nullptr};
  };
  // AVX-512 takes the panels two at a time (the pair kernel), the others one at a time.
  const int64_t step = kIsa == Isa::kAvx512 ? 2 : 1;
  at::parallel_for(0, (panels + step - 1) / step, 2, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const int64_t p = j * step;
      if (step == 2 && p + 1 < panels) {
        panel_pair_rows(block_of(p), block_of(p + 1), m);
      } else {
        panel_rows(block_of(p), m);
      }
    }
  });
  return y;
}

std::string packed_linear_isa() {
  return kIsa == Isa::kAvx512 ? "avx512" : kIsa == Isa::kAvx2 ? "avx2" : "portable";
}

}  // namespace

namespace kvbench_cpu {

Isa library_isa() {
  static const Isa isa = [] {
    const char* forced = std::getenv("KVBENCH_GEMM_ISA");
    const std::string want = forced ? forced : "";
    if (want == "portable") return Isa::kPortable;
#ifdef KVBENCH_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && want != "avx2") return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
    return Isa::kPortable;
  }();
  return isa;
}

}  // namespace kvbench_cpu

TORCH_LIBRARY_FRAGMENT(kvbench_dense, m) {
  m.def("pack_linear_weight(Tensor w) -> Tensor");
  m.def("packed_linear(Tensor x, Tensor packed, int n, Tensor? bias=None) -> Tensor");
  m.def("packed_linear_isa() -> str", &packed_linear_isa);  // the instruction set chosen at load
}

TORCH_LIBRARY_IMPL(kvbench_dense, CPU, m) {
  m.impl("pack_linear_weight", &pack_linear_weight);
  m.impl("packed_linear", &packed_linear);
}
