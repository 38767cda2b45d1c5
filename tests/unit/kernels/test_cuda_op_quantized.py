"""The torch.ops.kvbench op (kernels/cuda_op.py) over a quantized KV cache: the C++ CPU kernel
against the torch reference over the same fp8 / int8 cache (kernels/quant.py) at every kv_dtype
and scale granularity, every byte's decode, the quantizing write (``kvbench::write_kv_quant``:
the reference's exact bytes and scales, every rounding boundary), opcheck and the refusals. The
CUDA kernels' own quantized path runs in test_cuda_emulated_quantized.py (and on a GPU, ``gpu``).
"""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import cuda_op
from kvbench.kernels.cuda_op import paged_decode_attention_cuda, write_kv_cuda
from kvbench.kernels.quant import KVScales
from kvbench.kernels.validate import KernelArgumentError
from tests.helpers.byte_decode_cases import BYTE_DTYPES, check_every_byte
from tests.helpers.kernel_cases import MIXED_LENS, make_decode_inputs
from tests.helpers.kv_quant_cases import KV_CASES, check_quantized_decode, check_quantized_write, quantized_copy
from tests.helpers.write_quant_cases import check_write_boundaries, check_write_quant

LONG_LENS = [1, 511, 513, 1500]

# block, kv_heads, group, head_dim, q dtype: block sizes 1-128, MHA to wide GQA, every head dim
SHAPES = [(1, 2, 4, 64, torch.float32), (8, 1, 8, 80, torch.bfloat16), (16, 2, 1, 64, torch.float16),
          (32, 3, 2, 96, torch.float32), (128, 1, 12, 128, torch.bfloat16), (4, 2, 3, 256, torch.float32)]


@pytest.fixture(scope="module")
def op():
    return cuda_op.load_op()


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(("kv_dtype", "kv_scale"), KV_CASES)
def test_decode_matches_reference_on_quantized_cache(op, kv_dtype, kv_scale, shape):
    block, kv_heads, group, head_dim, q_dtype = shape
    check_quantized_decode(paged_decode_attention_cuda, MIXED_LENS, kv_heads, group, head_dim, block, q_dtype,
                           kv_dtype, kv_scale)


@pytest.mark.parametrize(("kv_dtype", "kv_scale"), KV_CASES)
def test_decode_long_contexts_on_quantized_cache(op, kv_dtype, kv_scale):
    check_quantized_decode(paged_decode_attention_cuda, LONG_LENS, 2, 2, 64, 16, torch.float16, kv_dtype, kv_scale,
                           seed=5)


@pytest.mark.parametrize("dynamic", [False, True], ids=["tensor", "token_head"])
@pytest.mark.parametrize("dtype", BYTE_DTYPES, ids=str)
def test_every_byte_decodes_as_torch_casts_it(op, dtype, dynamic):
    check_every_byte(paged_decode_attention_cuda, dtype, dynamic)


@pytest.mark.parametrize(("kv_dtype", "kv_scale"), KV_CASES)
def test_write_quantizes_bit_for_bit(op, kv_dtype, kv_scale):
    check_quantized_write(write_kv_cuda, 23, 3, 80, 8, kv_dtype, kv_scale)


# tokens, kv_heads, head_dim, block_size, key/value dtype: odd token counts (and one), head dims 64 / 80
# / 128, block sizes 1 to 128, MHA-like and GQA-like kv head counts, every float input dtype.
WRITE_SHAPES = [(23, 3, 80, 8, torch.float32), (37, 2, 64, 16, torch.bfloat16), (9, 1, 128, 1, torch.float16),
                (51, 4, 128, 32, torch.float32), (5, 2, 64, 128, torch.bfloat16), (1, 8, 80, 4, torch.float16)]


@pytest.mark.parametrize("shape", WRITE_SHAPES, ids=str)
@pytest.mark.parametrize(("kv_dtype", "kv_scale"), KV_CASES)
def test_quantizing_write_matches_reference(op, kv_dtype, kv_scale, shape):
    """The C++ kernel stores the reference quantizer's bytes and scales exactly; padding and untouched
    slots keep their bytes (and, per token and head, their scales)."""
    check_write_quant(write_kv_cuda, *shape, kv_dtype, kv_scale)


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2", "int8"])
def test_quantizing_write_rounds_every_boundary_as_torch(op, kv_dtype):
    check_write_boundaries(write_kv_cuda, kv_dtype)


@pytest.mark.parametrize("kv_scale", ["tensor", "token_head"])
def test_quantizing_write_of_padding_only_changes_nothing(op, kv_scale):
    key = torch.randn(3, 2, 64)
    kq = torch.randint(0, 256, (4, 8, 2, 64), dtype=torch.uint8).view(torch.float8_e4m3fn)
    vq = kq.clone()
    scales = KVScales.allocate(kv_scale, tuple(kq.shape), kq.device)
    before = (kq.clone(), vq.clone(), scales.k.clone(), scales.v.clone())
    write_kv_cuda(key, key, kq, vq, torch.full((3,), -1), scales=scales)
    write_kv_cuda(key[:0], key[:0], kq, vq, torch.empty(0, dtype=torch.long), scales=scales)
    for got, want in zip((kq, vq, scales.k, scales.v), before):
        assert torch.equal(got.view(torch.uint8) if got.element_size() == 1 else got,
                           want.view(torch.uint8) if want.element_size() == 1 else want)


def _quantized_inputs(kv_dtype="fp8_e4m3", kv_scale="tensor", q_dtype=torch.float32):
    q, k, v, tables, lens = make_decode_inputs(MIXED_LENS, 2, 4, 64, 16, torch.float32)
    kq, vq, scales = quantized_copy(k, v, kv_dtype, kv_scale)
    return q.to(q_dtype), kq, vq, tables, lens, scales


OPCHECK_ALL = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
OPCHECK_NO_SCHEMA = OPCHECK_ALL[1:]


# opcheck's schema test perturbs every input tensor with a multiply torch has no fp8 kernel for
# ("mul_cpu_reduced_float" not implemented for 'Float8_e5m2'), so fp8 caches skip that one test; int8 runs all.
@pytest.mark.parametrize(("kv_dtype", "kv_scale", "test_utils"), [
    ("int8", "token_head", OPCHECK_ALL), ("int8", "tensor", OPCHECK_ALL),
    ("fp8_e5m2", "tensor", OPCHECK_NO_SCHEMA), ("fp8_e4m3", "token_head", OPCHECK_NO_SCHEMA),
], ids=str)
def test_opcheck_quantized(op, kv_dtype, kv_scale, test_utils):
    q, kq, vq, tables, lens, scales = _quantized_inputs(kv_dtype, kv_scale, torch.bfloat16)
    torch.library.opcheck(torch.ops.kvbench.paged_decode_attention.default,
                          (q, kq, vq, tables, lens, 0.125, scales.k, scales.v), test_utils=test_utils)
    torch.library.opcheck(torch.ops.kvbench.paged_decode_attention_out.default,
                          (q, kq, vq, tables, lens, 0.125, torch.empty_like(q), scales.k, scales.v),
                          test_utils=test_utils)


@pytest.mark.parametrize(("kv_dtype", "kv_scale", "test_utils"), [
    ("int8", "token_head", OPCHECK_ALL), ("int8", "tensor", OPCHECK_ALL),
    ("fp8_e4m3", "tensor", OPCHECK_NO_SCHEMA), ("fp8_e5m2", "token_head", OPCHECK_NO_SCHEMA),
], ids=str)
def test_opcheck_quantizing_write(op, kv_dtype, kv_scale, test_utils):
    _, kq, vq, _, _, scales = _quantized_inputs(kv_dtype, kv_scale)
    key, value = torch.randn(2, 5, 2, 64, dtype=torch.bfloat16).unbind(0)
    slots = torch.tensor([3, -1, 40, 7, 0])
    torch.library.opcheck(torch.ops.kvbench.write_kv_quant.default,
                          (key, value, kq.clone(), vq.clone(), slots, scales.k.clone(), scales.v.clone()),
                          test_utils=test_utils)


def _write_then_attend_quantized(q, key, value, k_cache, v_cache, slots, tables, lens, scales):
    write_kv_cuda(key, value, k_cache, v_cache, slots, scales=scales)
    return paged_decode_attention_cuda(q, k_cache, v_cache, tables, lens, 0.125, scales=scales)


@pytest.mark.parametrize("kv_scale", ["tensor", "token_head"])
def test_quantizing_write_traces_in_torch_compile(op, kv_scale):
    """One fullgraph (aot_eager: tracing and functionalization, no codegen) through the quantizing write
    and the decode gives eager's output, cache bytes and written scales."""
    q, kq, vq, tables, lens, scales = _quantized_inputs("int8", kv_scale)
    key, value = torch.randn(2, len(MIXED_LENS), 2, 64).unbind(0)
    slots = torch.stack([tables[b, (n - 1) // 16].long() * 16 + (n - 1) % 16 for b, n in enumerate(MIXED_LENS)])
    copies = [(kq.clone(), vq.clone(), KVScales(scales.k.clone(), scales.v.clone(), scales.dynamic)) for _ in range(2)]
    (ek, ev, es), (ck, cv, cs) = copies
    want = _write_then_attend_quantized(q, key, value, ek, ev, slots, tables, lens, es)
    torch._dynamo.reset()
    compiled = torch.compile(_write_then_attend_quantized, fullgraph=True, backend="aot_eager")
    got = compiled(q, key, value, ck, cv, slots, tables, lens, cs)
    assert torch.equal(got, want)
    assert torch.equal(ck, ek) and torch.equal(cv, ev) and torch.equal(cs.k, es.k) and torch.equal(cs.v, es.v)


@pytest.mark.parametrize(("case", "match"), [
    ("float_cache", "a float cache takes kvbench.write_kv"),
    ("int_rows", "key and value must both be float32, float16 or bfloat16"),
    ("mixed_rows", "key and value must both be"),
    ("bad_scale_shape", "0-dim .per tensor. or"),
    ("fp64_scale", "contiguous float32"),
    ("slot_past_pool", "slot_mapping"),
])
def test_quantizing_write_op_rejects_bad_args(op, case, match):
    """Called directly through torch.ops (no Python checks), the quantizing write says what is wrong."""
    _, kq, vq, _, _, scales = _quantized_inputs("int8", "token_head")
    key = value = torch.randn(2, 2, 64)
    k_scale, v_scale, slots = scales.k, scales.v, torch.tensor([0, 5])
    if case == "float_cache":
        kq, vq = kq.float(), vq.float()
    elif case == "int_rows":
        key = value = key.to(torch.int8)
    elif case == "mixed_rows":
        value = value.half()
    elif case == "bad_scale_shape":
        k_scale = v_scale = torch.ones(3)
    elif case == "fp64_scale":
        k_scale = k_scale.double()
    else:
        slots = torch.tensor([0, kq.shape[0] * kq.shape[1]])
    with pytest.raises(RuntimeError, match=match):
        torch.ops.kvbench.write_kv_quant(key, value, kq, vq, slots, k_scale, v_scale)


def test_the_float_call_is_unchanged_by_the_optional_scales(op):
    """Scales left out and passed as None are one call: the float path takes no new argument."""
    q, k, v, tables, lens = make_decode_inputs(MIXED_LENS, 2, 4, 64, 16, torch.bfloat16)
    plain = torch.ops.kvbench.paged_decode_attention(q, k, v, tables, lens, 0.125)
    assert torch.equal(plain, torch.ops.kvbench.paged_decode_attention(q, k, v, tables, lens, 0.125, None, None))


@pytest.mark.parametrize(("case", "match"), [
    ("no_scales", "needs k_scale and v_scale"),
    ("scales_on_float", "takes no k_scale"),
    ("one_scale", "both k_scale and v_scale"),
    ("bad_shape", "0-dim .per tensor. or"),
    ("mixed_granularity", "differ in shape"),
    ("fp64_scale", "contiguous float32"),
])
def test_op_rejects_bad_scales(op, case, match):
    """Called directly through torch.ops (no Python checks), the op says what is wrong."""
    q, kq, vq, tables, lens, scales = _quantized_inputs()
    dynamic = KVScales.allocate("token_head", tuple(kq.shape), kq.device)
    cache, k_scale, v_scale = kq, scales.k, scales.v
    if case == "no_scales":
        k_scale = v_scale = None
    elif case == "scales_on_float":
        cache = kq.float()
    elif case == "one_scale":
        v_scale = None
    elif case == "bad_shape":
        k_scale = v_scale = torch.ones(3)
    elif case == "mixed_granularity":
        v_scale = dynamic.v
    else:
        k_scale = k_scale.double()
    v_cache = vq.float() if case == "scales_on_float" else vq
    with pytest.raises(RuntimeError, match=match):
        torch.ops.kvbench.paged_decode_attention(q, cache, v_cache, tables, lens, 0.125, k_scale, v_scale)


def test_wrappers_reject_a_quantized_cache_without_scales(op):
    q, kq, vq, tables, lens, scales = _quantized_inputs("int8")
    with pytest.raises(KernelArgumentError, match="needs scales"):
        paged_decode_attention_cuda(q, kq, vq, tables, lens, 0.125)
    key = value = torch.randn(2, 2, 64)
    with pytest.raises(KernelArgumentError, match="needs scales"):
        write_kv_cuda(key, value, kq, vq, torch.tensor([0, 5]))
    with pytest.raises(KernelArgumentError, match="scales.k must be contiguous float32"):
        paged_decode_attention_cuda(q, kq, vq, tables, lens, 0.125,
                                    scales=KVScales(torch.ones(3), torch.ones(3), False))


# --- the CUDA kernels, on a GPU --------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(("kv_dtype", "kv_scale"), KV_CASES)
def test_cuda_quantized_decode_matches_cpu_kernel(op, kv_dtype, kv_scale):
    q, kq, vq, tables, lens, scales = _quantized_inputs(kv_dtype, kv_scale, torch.bfloat16)
    cpu = paged_decode_attention_cuda(q, kq, vq, tables, lens, 0.1, scales=scales)
    cuda_scales = KVScales(scales.k.cuda(), scales.v.cuda(), scales.dynamic)
    gpu = paged_decode_attention_cuda(*(t.cuda() for t in (q, kq, vq, tables, lens)), 0.1, scales=cuda_scales)
    torch.testing.assert_close(gpu.cpu().float(), cpu.float(), atol=2e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize(("kv_dtype", "kv_scale"), KV_CASES)
def test_cuda_quantizing_write_matches_reference(op, kv_dtype, kv_scale):
    """The CUDA kernel against the CPU reference (write_quant_cases: torch on CUDA divides by a scalar
    through its reciprocal, so the CPU is the reference): the same bytes and scales."""
    for shape in [(301, 8, 128, 16, torch.bfloat16), (37, 3, 80, 1, torch.float32), (9, 2, 64, 128, torch.float16)]:
        check_write_quant(write_kv_cuda, *shape, kv_dtype, kv_scale, device="cuda")
