// A quantized KV cache's one-byte elements decoded to float, for the C++ CPU kernel and the
// CUDA kernel (and so its emulator) alike (formats: kernels/kv_formats.py; scales: kernels/quant.py).
//
// Exact bit decodes, no lookup table: the CUDA kernel decodes in registers (the C++ CPU kernel
// has branch-free twins that vectorise, paged_attention_cpu.cpp). Every byte value decodes as
// torch's cast to float32 does (tests/helpers/byte_decode_cases.py checks all 256 of each
// format through the op and through the emulated CUDA kernels).
// - float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN.
// - float8_e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-style inf and NaN.
// - int8: the integer itself (symmetric quantization: stored * scale).

#pragma once

#include <cstdint>
#include <cstring>

#ifndef KVB_HOST_DEVICE
#if defined(__CUDACC__) && !defined(KVBENCH_CUDA_EMULATION)
#define KVB_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KVB_HOST_DEVICE inline
#endif
#endif

namespace kvbench_quant {

// The cache's element types, distinct so kernels template on them (a byte does not say its format).
struct Fp8E4M3 { uint8_t bits; };
struct Fp8E5M2 { uint8_t bits; };

// Codes the op passes the launchers for a cache's element type, after the float ones (0-2).
constexpr int kCacheFp8E4M3 = 3;
constexpr int kCacheFp8E5M2 = 4;
constexpr int kCacheInt8 = 5;

// Scale granularities (kernels/quant.py KVScales): one fp32 per layer, or one per token and kv head.
constexpr int kScaleNone = 0;
constexpr int kScaleTensor = 1;
constexpr int kScaleTokenHead = 2;

KVB_HOST_DEVICE float bits_to_float(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

// A float8 with EXP exponent bits and MAN mantissa bits: normals are rebuilt as fp32 bit patterns
// (exponent rebiased), subnormals as mantissa * 2^(1 - bias - MAN), a product exact in fp32.
template <int EXP, int MAN>
KVB_HOST_DEVICE float fp8_to_float(uint8_t b) {
  constexpr int kBias = (1 << (EXP - 1)) - 1;
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> MAN) & ((1u << EXP) - 1);
  const uint32_t man = b & ((1u << MAN) - 1);
  float mag;
  if (exp == 0) {
    mag = static_cast<float>(man) * bits_to_float(static_cast<uint32_t>(127 + 1 - kBias - MAN) << 23);
  } else {
    mag = bits_to_float(((exp + 127 - kBias) << 23) | (man << (23 - MAN)));
  }
  return sign ? -mag : mag;
}

KVB_HOST_DEVICE float to_float_q(Fp8E4M3 x) {
  if ((x.bits & 0x7fu) == 0x7fu) return bits_to_float(0x7fc00000u | (static_cast<uint32_t>(x.bits & 0x80u) << 24));
  return fp8_to_float<4, 3>(x.bits);
}

KVB_HOST_DEVICE float to_float_q(Fp8E5M2 x) {
  if ((x.bits & 0x7cu) == 0x7cu) {  // all-ones exponent: inf (mantissa 0) or NaN
    const uint32_t sign = static_cast<uint32_t>(x.bits & 0x80u) << 24;
    return bits_to_float(sign | ((x.bits & 0x03u) ? 0x7fc00000u : 0x7f800000u));
  }
  return fp8_to_float<5, 2>(x.bits);
}

KVB_HOST_DEVICE float to_float_q(int8_t x) { return static_cast<float>(x); }

}  // namespace kvbench_quant
