// torch.ops.kvbench: the paged-attention op schemas and their CPU / CUDA kernels.
//
// The CUDA kernels are linked in only when the build defines KVBENCH_WITH_CUDA
// (kernels/cuda_op.py does so when torch has CUDA); they live in
// paged_attention.cu behind extern "C" launchers that take raw pointers
// (declared in paged_attention.h).
//
// With KVBENCH_CUDA_EMULATION instead (kernels/cuda_emulated.py), this same file builds
// torch.ops.kvbench_emu: the CUDA path below (checks, workspace, launcher arguments)
// registered for CPU tensors, over paged_attention.cu compiled for the CPU emulator
// (cuda_emulation.h). That is how the CUDA code is tested on a machine with no GPU.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "kv_quant.h"

#if defined(KVBENCH_WITH_CUDA) || defined(KVBENCH_CUDA_EMULATION)
#define KVBENCH_CUDA_LAUNCHERS
#include "paged_attention.h"
#endif

#ifdef KVBENCH_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define KVBENCH_DEVICE_GUARD(tensor) const c10::cuda::CUDAGuard guard((tensor).device())
#define KVBENCH_CURRENT_STREAM() c10::cuda::getCurrentCUDAStream().stream()
#else  // the emulator: CPU tensors, one implicit device and stream
#define KVBENCH_DEVICE_GUARD(tensor) (void)(tensor)
#define KVBENCH_CURRENT_STREAM() cudaStream_t{}
#endif

namespace kvbench {

void paged_decode_attention_cpu_out(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                    const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                                    at::Tensor& out, const std::optional<at::Tensor>& k_scale,
                                    const std::optional<at::Tensor>& v_scale, int64_t window,
                                    const std::optional<at::Tensor>& sinks);
void write_kv_cpu(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                  const at::Tensor& slot_mapping);
void write_kv_quant_cpu(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                        const at::Tensor& slot_mapping, at::Tensor& k_scale, at::Tensor& v_scale);

namespace {

using OptTensor = std::optional<at::Tensor>;

// A quantized cache's one-byte element types (kernels/kv_formats.py): read by the decode with
// scales, written by write_kv_quant.
bool is_quantized(at::ScalarType dtype) {
  return dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2 || dtype == at::kChar;
}

// The Python wrappers check more, with nicer errors (kernels/validate.py); these
// guard the kernels when the op is called directly through torch.ops.
void check_cache(const at::Tensor& k_cache, const at::Tensor& v_cache, const char* op, bool quantized_ok = false) {
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(), op,
              ": k_cache and v_cache must both be [num_blocks, block_size, kv_heads, head_dim]");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), op, ": k_cache and v_cache dtypes differ");
  const auto dtype = k_cache.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 ||
                  (quantized_ok && is_quantized(dtype)),
              op, ": cache dtype must be float32, float16 or bfloat16",
              quantized_ok ? " (or float8_e4m3fn, float8_e5m2, int8 with k_scale and v_scale)" : "", ", got ", dtype);
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), op, ": k_cache and v_cache must be contiguous");
  const int64_t block_size = k_cache.size(1);
  TORCH_CHECK(block_size >= 1 && block_size <= 128 && (block_size & (block_size - 1)) == 0, op,
              ": block_size must be a power of two in [1, 128], got ", block_size);
  TORCH_CHECK(k_cache.size(2) > 0 && k_cache.size(3) > 0, op, ": kv_heads and head_dim must be positive");
  TORCH_CHECK(k_cache.device() == v_cache.device(), op, ": k_cache and v_cache are on different devices");
}

// A quantized cache's scales (kernels/quant.py KVScales): both or neither, only with a one-byte
// cache; fp32, contiguous, 0-dim (per tensor) or [num_blocks, block_size, kv_heads] (per token
// and kv head), alike, on the cache's device.
void check_scales(const at::Tensor& k_cache, const OptTensor& k_scale, const OptTensor& v_scale, const char* op) {
  const bool quantized = is_quantized(k_cache.scalar_type());
  TORCH_CHECK(k_scale.has_value() == v_scale.has_value(), op, ": give both k_scale and v_scale, or neither");
  TORCH_CHECK(k_scale.has_value() == quantized, op, ": a ", k_cache.scalar_type(), " cache ",
              quantized ? "needs" : "takes no", " k_scale and v_scale");
  if (!quantized) return;
  for (const at::Tensor* s : {&*k_scale, &*v_scale}) {
    TORCH_CHECK(s->scalar_type() == at::kFloat && s->is_contiguous() && s->device() == k_cache.device(), op,
                ": k_scale and v_scale must be contiguous float32 on the cache's device");
    TORCH_CHECK(s->dim() == 0 || s->sizes() == k_cache.sizes().slice(0, 3), op,
                ": a scale must be 0-dim (per tensor) or [num_blocks, block_size, kv_heads], got ", s->sizes());
  }
  TORCH_CHECK(k_scale->sizes() == v_scale->sizes(), op, ": k_scale and v_scale differ in shape");
}

void check_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& block_tables, const at::Tensor& context_lens, const OptTensor& k_scale,
                  const OptTensor& v_scale) {
  const char* op = "kvbench.paged_decode_attention";
  check_cache(k_cache, v_cache, op, /*quantized_ok=*/true);
  check_scales(k_cache, k_scale, v_scale, op);
  TORCH_CHECK(q.dim() == 3, op, ": q must be [batch, heads, head_dim]");
  if (is_quantized(k_cache.scalar_type())) {
    TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
                op, ": q must be float32, float16 or bfloat16, got ", q.scalar_type());
  } else {
    TORCH_CHECK(q.scalar_type() == k_cache.scalar_type(), op, ": q and cache dtypes differ");
  }
  TORCH_CHECK(q.size(2) == k_cache.size(3), op, ": q head_dim ", q.size(2), " != cache head_dim ", k_cache.size(3));
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, op, ": query heads ", q.size(1), " not a multiple of kv_heads ",
              k_cache.size(2));
  TORCH_CHECK(q.stride(2) == 1, op, ": q's last dimension must be contiguous");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == q.size(0) &&
                  block_tables.scalar_type() == at::kInt && block_tables.is_contiguous(),
              op, ": block_tables must be contiguous int32 [batch, max_blocks]");
  TORCH_CHECK(context_lens.dim() == 1 && context_lens.size(0) == q.size(0) &&
                  context_lens.scalar_type() == at::kInt && context_lens.is_contiguous(),
              op, ": context_lens must be contiguous int32 [batch]");
  for (const at::Tensor* t : {&k_cache, &block_tables, &context_lens})
    TORCH_CHECK(t->device() == q.device(), op, ": all tensors must be on q's device ", q.device());
}

// A layer's attention sinks (kernels/sinks.py): none, or contiguous float32 [heads] on q's device.
void check_sinks(const at::Tensor& q, const OptTensor& sinks) {
  if (!sinks.has_value()) return;
  TORCH_CHECK(sinks->dim() == 1 && sinks->size(0) == q.size(1) && sinks->scalar_type() == at::kFloat &&
                  sinks->is_contiguous() && sinks->device() == q.device(),
              "kvbench.paged_decode_attention: sinks must be contiguous float32 [heads=", q.size(1),
              "] on q's device, got ", sinks->scalar_type(), " ", sinks->sizes());
}

void check_out(const at::Tensor& q, const at::Tensor& out) {
  const char* op = "kvbench.paged_decode_attention_out";
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type() && out.device() == q.device(), op,
              ": out must have q's shape, dtype and device");
  TORCH_CHECK(out.stride(2) == 1, op, ": out's last dimension must be contiguous");
}

// What a float and a quantizing write check alike: the rows, the slots and the devices.
void check_write_rows(const at::Tensor& key, const at::Tensor& value, const at::Tensor& k_cache,
                      const at::Tensor& slot_mapping, const char* op) {
  TORCH_CHECK(key.dim() == 3 && key.sizes() == value.sizes(), op,
              ": key and value must both be [tokens, kv_heads, head_dim]");
  TORCH_CHECK(key.size(1) == k_cache.size(2) && key.size(2) == k_cache.size(3), op,
              ": key rows do not match the cache's [kv_heads, head_dim]");
  TORCH_CHECK(key.stride(2) == 1 && value.stride(2) == 1, op, ": key/value last dimension must be contiguous");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0) &&
                  slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
              op, ": slot_mapping must be contiguous int64 [tokens]");
  for (const at::Tensor* t : {&value, &k_cache, &slot_mapping})
    TORCH_CHECK(t->device() == key.device(), op, ": all tensors must be on key's device ", key.device());
}

void check_write(const at::Tensor& key, const at::Tensor& value, const at::Tensor& k_cache,
                 const at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  const char* op = "kvbench.write_kv";
  check_cache(k_cache, v_cache, op);
  check_write_rows(key, value, k_cache, slot_mapping, op);
  TORCH_CHECK(key.scalar_type() == k_cache.scalar_type() && value.scalar_type() == k_cache.scalar_type(), op,
              ": key/value dtype must equal the cache dtype");
}

// A quantizing write: a one-byte cache with its scales (check_scales), float rows of one dtype.
void check_write_quant(const at::Tensor& key, const at::Tensor& value, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& slot_mapping, const at::Tensor& k_scale,
                       const at::Tensor& v_scale) {
  const char* op = "kvbench.write_kv_quant";
  check_cache(k_cache, v_cache, op, /*quantized_ok=*/true);
  TORCH_CHECK(is_quantized(k_cache.scalar_type()), op,
              ": cache dtype must be float8_e4m3fn, float8_e5m2 or int8 (a float cache takes kvbench.write_kv), got ",
              k_cache.scalar_type());
  check_scales(k_cache, k_scale, v_scale, op);
  check_write_rows(key, value, k_cache, slot_mapping, op);
  const auto dtype = key.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16) && value.scalar_type() == dtype,
              op, ": key and value must both be float32, float16 or bfloat16, got ", dtype, " and ",
              value.scalar_type());
}

#ifndef KVBENCH_CUDA_EMULATION
void decode_out_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                    const at::Tensor& block_tables, const at::Tensor& context_lens, double scale, at::Tensor& out,
                    const OptTensor& k_scale, const OptTensor& v_scale, int64_t window, const OptTensor& sinks) {
  check_decode(q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale);
  check_out(q, out);
  check_sinks(q, sinks);
  paged_decode_attention_cpu_out(q, k_cache, v_cache, block_tables, context_lens, scale, out, k_scale, v_scale,
                                 window, sinks);
}

at::Tensor decode_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                      const OptTensor& k_scale, const OptTensor& v_scale, int64_t window, const OptTensor& sinks) {
  at::Tensor out = at::empty(q.sizes(), q.options());
  decode_out_cpu(q, k_cache, v_cache, block_tables, context_lens, scale, out, k_scale, v_scale, window, sinks);
  return out;
}

void write_kv_cpu_checked(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                          const at::Tensor& slot_mapping) {
  check_write(key, value, k_cache, v_cache, slot_mapping);
  write_kv_cpu(key, value, k_cache, v_cache, slot_mapping);
}

void write_kv_quant_cpu_checked(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache,
                                at::Tensor& v_cache, const at::Tensor& slot_mapping, at::Tensor& k_scale,
                                at::Tensor& v_scale) {
  check_write_quant(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale);
  write_kv_quant_cpu(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale);
}
#endif

#ifdef KVBENCH_CUDA_LAUNCHERS
int dtype_code(at::ScalarType dtype) {  // check_cache allowed only these
  switch (dtype) {
    case at::kFloat: return 0;
    case at::kHalf: return 1;
    case at::kBFloat16: return 2;
    case at::kFloat8_e4m3fn: return kvbench_quant::kCacheFp8E4M3;
    case at::kFloat8_e5m2: return kvbench_quant::kCacheFp8E5M2;
    default: return kvbench_quant::kCacheInt8;
  }
}

void check_status(int status, const char* op) {
  TORCH_CHECK(status == 0, op, " (CUDA): ", kvbench_cuda_status_string(status));
}

void decode_out_cuda(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const at::Tensor& context_lens, double scale, at::Tensor& out,
                     const OptTensor& k_scale, const OptTensor& v_scale, int64_t window, const OptTensor& sinks) {
  check_decode(q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale);
  check_out(q, out);
  check_sinks(q, sinks);
  KVBENCH_DEVICE_GUARD(q);
  const int batch = q.size(0), heads = q.size(1), head_dim = q.size(2);
  const int block_size = k_cache.size(1), width = block_tables.size(1);
  const size_t workspace_bytes =
      kvbench_paged_decode_workspace_bytes(batch, heads, k_cache.size(2), head_dim, block_size, width);
  at::Tensor workspace;  // from torch's caching allocator, on this stream
  if (workspace_bytes > 0)
    workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, q.options().dtype(at::kByte));
  const int status = kvbench_paged_decode_attention(
      out.data_ptr(), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr<int32_t>(),
      context_lens.data_ptr<int32_t>(), workspace_bytes > 0 ? workspace.data_ptr() : nullptr,
      dtype_code(q.scalar_type()), dtype_code(k_cache.scalar_type()),
      k_scale.has_value() ? k_scale->data_ptr<float>() : nullptr,
      v_scale.has_value() ? v_scale->data_ptr<float>() : nullptr,
      !k_scale.has_value()       ? kvbench_quant::kScaleNone
      : k_scale->dim() == 0      ? kvbench_quant::kScaleTensor
                                 : kvbench_quant::kScaleTokenHead,
      batch, heads, k_cache.size(2), head_dim, block_size, width, q.stride(0),
      q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
      block_tables.stride(0), static_cast<float>(scale), static_cast<int>(std::clamp<int64_t>(window, 0, INT32_MAX)),
      sinks.has_value() ? sinks->data_ptr<float>() : nullptr, KVBENCH_CURRENT_STREAM());
  check_status(status, "kvbench.paged_decode_attention");
}

at::Tensor decode_cuda(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                       const OptTensor& k_scale, const OptTensor& v_scale, int64_t window, const OptTensor& sinks) {
  at::Tensor out = at::empty(q.sizes(), q.options());
  decode_out_cuda(q, k_cache, v_cache, block_tables, context_lens, scale, out, k_scale, v_scale, window, sinks);
  return out;
}

void write_kv_cuda(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                   const at::Tensor& slot_mapping) {
  check_write(key, value, k_cache, v_cache, slot_mapping);
  KVBENCH_DEVICE_GUARD(key);
  const int status = kvbench_write_kv(
      key.data_ptr(), value.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), slot_mapping.data_ptr<int64_t>(),
      dtype_code(key.scalar_type()), key.size(0), key.size(1), key.size(2), k_cache.size(1),
      k_cache.size(0) * k_cache.size(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
      k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), KVBENCH_CURRENT_STREAM());
  check_status(status, "kvbench.write_kv");
}

void write_kv_quant_cuda(const at::Tensor& key, const at::Tensor& value, at::Tensor& k_cache, at::Tensor& v_cache,
                         const at::Tensor& slot_mapping, at::Tensor& k_scale, at::Tensor& v_scale) {
  check_write_quant(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale);
  KVBENCH_DEVICE_GUARD(key);
  const int status = kvbench_write_kv_quant(
      key.data_ptr(), value.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_scale.data_ptr<float>(),
      v_scale.data_ptr<float>(), slot_mapping.data_ptr<int64_t>(), dtype_code(key.scalar_type()),
      dtype_code(k_cache.scalar_type()),
      k_scale.dim() == 0 ? kvbench_quant::kScaleTensor : kvbench_quant::kScaleTokenHead, key.size(0), key.size(1),
      key.size(2), k_cache.size(1), k_cache.size(0) * k_cache.size(1), key.stride(0), key.stride(1),
      value.stride(0), value.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
      KVBENCH_CURRENT_STREAM());
  check_status(status, "kvbench.write_kv_quant");
}
#endif

}  // namespace
}  // namespace kvbench

namespace {

void define_ops(torch::Library& m) {
  // k_scale / v_scale: a quantized cache's (float8_e4m3fn, float8_e5m2 or int8) fp32 scales, 0-dim
  // per tensor or [num_blocks, block_size, kv_heads] per token and kv head; None for a float cache.
  // window > 0: a sliding window in tokens (keys before context_len - window are masked); 0 or less: none.
  // sinks: float32 [heads] attention sinks (kernels/sinks.py), in every softmax's denominator; None: none.
  m.def(
      "paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor context_lens, float scale, Tensor? k_scale=None, Tensor? v_scale=None, int window=0, "
      "Tensor? sinks=None) -> Tensor");
  // The out-variant: the kernel scenario and the engine pass a preallocated output (no extra copy).
  m.def(
      "paged_decode_attention_out(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor context_lens, float scale, Tensor(a!) out, Tensor? k_scale=None, Tensor? v_scale=None, "
      "int window=0, Tensor? sinks=None) -> ()");
  m.def("write_kv(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
  // A quantized cache's write: float rows quantized as kernels/quant.py does. k_scale / v_scale as above:
  // per tensor they are read (a static scale); per token and kv head each written slot's are written,
  // hence mutable. A float cache keeps write_kv and its schema.
  m.def(
      "write_kv_quant(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, "
      "Tensor(c!) k_scale, Tensor(d!) v_scale) -> ()");
}

#ifdef KVBENCH_CUDA_LAUNCHERS
// The CUDA path's kernels: for CUDA tensors, or for CPU tensors under the emulator.
void impl_cuda_path(torch::Library& m) {
  m.impl("paged_decode_attention", &kvbench::decode_cuda);
  m.impl("paged_decode_attention_out", &kvbench::decode_out_cuda);
  m.impl("write_kv", &kvbench::write_kv_cuda);
  m.impl("write_kv_quant", &kvbench::write_kv_quant_cuda);
}
#endif

}  // namespace

#ifdef KVBENCH_CUDA_EMULATION
TORCH_LIBRARY(kvbench_emu, m) { define_ops(m); }

TORCH_LIBRARY_IMPL(kvbench_emu, CPU, m) { impl_cuda_path(m); }
#else
TORCH_LIBRARY(kvbench, m) { define_ops(m); }

TORCH_LIBRARY_IMPL(kvbench, CPU, m) {
  m.impl("paged_decode_attention", &kvbench::decode_cpu);
  m.impl("paged_decode_attention_out", &kvbench::decode_out_cpu);
  m.impl("write_kv", &kvbench::write_kv_cpu_checked);
  m.impl("write_kv_quant", &kvbench::write_kv_quant_cpu_checked);
}
#endif

#ifdef KVBENCH_WITH_CUDA
TORCH_LIBRARY_IMPL(kvbench, CUDA, m) { impl_cuda_path(m); }
#endif
