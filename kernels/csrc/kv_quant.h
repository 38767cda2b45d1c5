// A quantized KV cache's one-byte elements decoded to float, and floats encoded to them, for the
// C++ CPU kernels and the CUDA kernels (and so their emulator) alike (formats: kernels/kv_formats.py;
// scales and the quantizer every write matches: kernels/quant.py).
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

// ---- Encoding: the writers' quantizer, kernels/quant.py's bit for bit ------------------------
//
// quant.py: a row's dynamic scale is max(amax(|x|) / qmax, MIN_SCALE); a value is stored as
// clamp(x / scale, -qmax, qmax), rounded to nearest (ties to even) onto the format: an fp8 cast or,
// for int8, round() then the cast. Every step is one correctly rounded fp32 operation (a true
// division, never a multiply by a reciprocal; a max; integer bit work), so a kernel that takes the
// same steps stores the reference's bytes on any hardware. Built without fast-math (the op's flags),
// where a division could become an approximate reciprocal and a rounding would differ.

// The largest magnitude each format holds (kernels/kv_formats.py qmax) and the floor of a dynamic
// scale (kernels/quant.py MIN_SCALE, as fp32: torch clamps an fp32 tensor at the scalar's fp32 value).
template <typename C> struct QFormat;
template <> struct QFormat<Fp8E4M3> { static constexpr float kQmax = 448.f; };
template <> struct QFormat<Fp8E5M2> { static constexpr float kQmax = 57344.f; };
template <> struct QFormat<int8_t> { static constexpr float kQmax = 127.f; };
constexpr float kMinScale = 1e-12f;

KVB_HOST_DEVICE uint32_t float_to_bits(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return bits;
}

// max that keeps a NaN, as torch's amax and clamp do (fmaxf would drop it).
KVB_HOST_DEVICE float max_keep_nan(float a, float b) { return (a > b || a != a) ? a : b; }

// A dynamic scale from its row's amax: amax / qmax (a true division), floored at kMinScale so a
// row of zeros still gets a finite scale.
template <typename C>
KVB_HOST_DEVICE float scale_from_amax(float amax) {
  const float s = amax / QFormat<C>::kQmax;
  return s < kMinScale ? kMinScale : s;  // a NaN stays NaN, as torch's clamp leaves it
}

// x / scale clamped to the format's range; a NaN passes through (torch's clamp keeps it).
template <typename C>
KVB_HOST_DEVICE float scaled_clamped(float x, float scale) {
  const float y = x / scale, q = QFormat<C>::kQmax;
  return y > q ? q : y < -q ? -q : y;
}

// A float8 with EXP exponent bits and MAN mantissa bits from an fp32 already within its range
// (|y| <= qmax: no overflow path), rounded to nearest, ties to even, in integer arithmetic alone
// (no dependence on a rounding mode or on libm). A NaN becomes S.1111111 (torch's NaN for both).
// - normal results: the fp32 bits rounded at the target's last mantissa bit (adding half an ulp
//   less one, plus the kept lsb, ties to even; a carry rolls into the exponent, as it should),
//   then the exponent rebiased;
// - subnormal results (|y| < 2^(1 - bias)): the significand, shifted to units of the smallest
//   subnormal, rounded the same way; a round-up to 2^MAN units is the smallest normal's code.
template <int EXP, int MAN>
KVB_HOST_DEVICE uint8_t fp8_from_clamped(float y) {
  constexpr int kBias = (1 << (EXP - 1)) - 1;
  constexpr int kShift = 23 - MAN;  // fp32 mantissa bits dropped
  const uint32_t bits = float_to_bits(y);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  const uint32_t exp = mag >> 23;
  uint32_t code;
  if (static_cast<int>(exp) - 127 >= 1 - kBias) {  // a normal of the target format
    const uint32_t rounded = mag + ((1u << (kShift - 1)) - 1) + ((mag >> kShift) & 1u);
    code = (rounded >> kShift) - (static_cast<uint32_t>(127 - kBias) << MAN);
  } else {
    // |y| = sig * 2^(exp - 150); in units of 2^(1 - bias - MAN) that is sig >> shift.
    const int shift = 150 + 1 - kBias - MAN - static_cast<int>(exp);  // > kShift here
    if (exp == 0 || shift > 25) {
      code = 0;  // below half the smallest subnormal (sig < 2^24 <= 2^(shift - 1))
    } else {
      const uint32_t sig = (mag & 0x7fffffu) | 0x800000u;
      const uint32_t half = 1u << (shift - 1), rest = sig & ((1u << shift) - 1);
      code = sig >> shift;
      code += (rest > half || (rest == half && (code & 1u))) ? 1u : 0u;
    }
  }
  return static_cast<uint8_t>(sign | code);
}

// Round to nearest, ties to even, of an fp32 with |y| < 2^22: adding and subtracting 1.5 * 2^23
// drops the fraction bits in the fp32 adder's own rounding (kernels/triton_quant.py does the same).
// Without fast-math neither g++ nor nvcc reassociates the two adds away; no multiply, no contraction.
KVB_HOST_DEVICE float round_half_even(float y) {
  constexpr float kMagic = 12582912.f;
  return (y + kMagic) - kMagic;
}

// A value already divided by its scale and clamped (scaled_clamped) to the stored element.
KVB_HOST_DEVICE Fp8E4M3 from_float_q(float y, Fp8E4M3) { return Fp8E4M3{fp8_from_clamped<4, 3>(y)}; }
KVB_HOST_DEVICE Fp8E5M2 from_float_q(float y, Fp8E5M2) { return Fp8E5M2{fp8_from_clamped<5, 2>(y)}; }
KVB_HOST_DEVICE int8_t from_float_q(float y, int8_t) { return static_cast<int8_t>(round_half_even(y)); }

}  // namespace kvbench_quant
