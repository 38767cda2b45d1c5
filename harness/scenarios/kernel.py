"""scenario=kernel: decode attention alone, per impl, at one point.

The point is the top-level ``batch`` and ``block_size``, the model's heads (``model=``)
and ``scenario.context_len``; a grid is a Hydra multirun (conf/sweep/*_kernel.yaml).
Fresh random K/V in a block pool (larger than the L2 cache on GPU), with the batch's
block tables shuffled ("paged" layout) and in order ("contiguous" layout). The impl's
cache kind says which layouts its kernel reads and how (``CacheKind.kernel_layouts``:
a paged kind's kernel reads both through the tables, the contiguous kind's SDPA reads
the in-order blocks as a slab), and the kernel comes from kernels/registry.py. Reports
median latency and effective bandwidth (bytes of K, V, Q and output / time) as a
fraction of the peak and of a device-to-device copy measured in the same job, and each
point's largest difference from the torch reference.

At a quantized ``kv_dtype`` the pool holds the random K/V quantized (``kv_scale``'s scales:
per tensor from the pool's amax, or per token and head), the bytes moved are the stored
bytes plus the per-token scales, the reference reads the same quantized pool, and
``kv_quant_max_abs_err`` is how far that reference lies from the one over the float K/V.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from kvbench.harness.config import ImplConfig, ScenarioConfig

if TYPE_CHECKING:  # reading a config imports this module; running it loads torch
    import torch

    from kvbench.harness.scenarios.job_run import JobRun
    from kvbench.impls.kinds import KernelPool


@dataclass
class KernelScenario(ScenarioConfig):
    """Decode attention alone at one point (harness/scenarios/kernel.py): the batch and block size
    are the top-level ``batch`` and ``block_size``, the heads the model's; sweep them with ``-m``."""

    name: str = "kernel"
    context_len: int = 1024  # tokens of K and V every sequence of the batch attends to
    warmup: int = 3  # untimed calls first
    iters: int = 20  # timed calls: the rows give their median and 10th/90th percentiles
    # A contiguous slab has no blocks, so block_size changes nothing it reads: a sweep over block_size
    # times it in the job whose block_size is this one, and skips it in the others. None: every job.
    slab_block_size: Optional[int] = None


SCHEMA = KernelScenario

# The Triton interpreter runs programs one by one in numpy: bound the work per call on CPU.
INTERPRETER_MAX_WORK = 2**16  # batch * kv_heads * context


def _clocks(device) -> tuple[int | None, str | None]:
    """The SM clock and NVML's throttle reasons on a GPU; (None, None) elsewhere."""
    if device.type != "cuda":
        return None, None
    import torch

    from kvbench.harness.measure.nvml import device_clocks

    return device_clocks(torch.cuda.current_device() if device.index is None else device.index)


def _skip(reason: str) -> dict:
    return {"status": "skipped", "error": reason}


def _quantized(pool: KernelPool, kv_dtype: str, kv_scale: str) -> KernelPool:
    """``pool`` with its K/V quantized to ``kv_dtype`` and its scales (kernels/quant.py)."""
    from dataclasses import replace

    from kvbench.kernels.quant import KVScales, kv_format, quantize, row_scales, storage_dtype, tensor_scale

    dtype = storage_dtype(kv_dtype)
    fmt, dynamic = kv_format(dtype), kv_scale == "token_head"
    scales = [row_scales(c, fmt) if dynamic else tensor_scale(c, fmt) for c in (pool.k_cache, pool.v_cache)]
    k, v = (quantize(c, s, dtype) for c, s in zip((pool.k_cache, pool.v_cache), scales))
    return replace(pool, k_cache=k, v_cache=v, scales=KVScales(scales[0], scales[1], dynamic))


def _inputs(batch: int, context: int, block_size: int, shape: tuple[int, int, int], dtype, device,
            gen: torch.Generator) -> tuple[torch.Tensor, KernelPool]:
    """Random queries, and random K/V for ``batch`` sequences of ``context`` tokens with their tables in both layouts."""
    import torch

    from kvbench.harness.measure.timing import L2_FLUSH_BYTES
    from kvbench.impls.kinds import KernelPool
    from kvbench.impls.sizing import blocks_for_tokens

    heads, kv_heads, head_dim = shape
    blocks_per_seq = blocks_for_tokens(context, block_size)
    elem = torch.finfo(dtype).bits // 8
    min_blocks = L2_FLUSH_BYTES // (block_size * kv_heads * head_dim * elem * 2) if device.type == "cuda" else 0
    num_blocks = max(batch * blocks_per_seq, min_blocks) + 1
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen, device=device).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen, device=device).to(dtype)
    q = torch.randn(batch, heads, head_dim, generator=gen, device=device).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen, device=device)[: batch * blocks_per_seq]
    shuffled = perm.view(batch, blocks_per_seq).to(torch.int32)
    identity = torch.arange(batch * blocks_per_seq, device=device, dtype=torch.int32).view(batch, -1)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return q, KernelPool(k_cache, v_cache, {"paged": shuffled, "contiguous": identity}, lens, context)


def run(job: JobRun, impl: ImplConfig) -> list[dict]:
    import torch

    from kvbench.harness.measure.bandwidth import peak_bandwidth_gbps
    from kvbench.harness.measure.metrics import attention_bytes, bandwidth_gbps
    from kvbench.harness.measure.timing import copy_bandwidth_gbps, time_call
    from kvbench.impls.kinds import cache_kind
    from kvbench.kernels.reference import paged_decode_attention_ref
    from kvbench.harness.measure.contention import probe_for, with_contention
    from kvbench.kernels.kv_formats import VALUE_BYTES, is_quantized, scale_bytes_per_head
    from kvbench.kernels.registry import get_paged_kernel

    kind = cache_kind(impl.cache, impl.reservation)
    if kind.kernel_skip_reason is not None:
        return [_skip(kind.kernel_skip_reason)]
    cfg, sc, device, model = job.cfg, job.cfg.scenario, job.device, job.cfg.model
    batch, context = cfg.batch, sc.context_len
    shape = (model.num_heads, model.num_kv_heads, model.head_dim)
    scale = model.head_dim**-0.5
    elem = torch.finfo(job.dtype).bits // 8
    if "copy_bw_gbps" not in job.memo:  # once per job, for all its impls
        job.memo["copy_bw_gbps"] = copy_bandwidth_gbps(device, 1 << 30 if device.type == "cuda" else 1 << 27)
    copy_bw, peak_bw = job.memo["copy_bw_gbps"], peak_bandwidth_gbps(device)
    kernel = get_paged_kernel(impl.kernel)
    # A kernel that cannot read cfg.kv_dtype was refused before (harness/job/impl_runner.py).
    quantized = is_quantized(cfg.kv_dtype)
    kv_elem = VALUE_BYTES if quantized else elem
    too_slow = kernel.interpreted and batch * shape[1] * context > INTERPRETER_MAX_WORK
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    q, pool = _inputs(batch, context, cfg.block_size, shape, job.dtype, device, gen)
    float_pool = pool
    if quantized:
        pool = _quantized(pool, cfg.kv_dtype, cfg.kv_scale)
    rows = []
    for layout, inputs in kind.kernel_layouts(pool).items():
        base = {"layout": layout, "kernel_batch": batch, "context_len": context,
                # a slab has no blocks: its rows name none
                "block_size": cfg.block_size if inputs.block_tables is not None else None,
                "num_heads": shape[0], "num_kv_heads": shape[1], "head_dim": shape[2],
                "copy_bw_gbps": copy_bw, "peak_bw_gbps": peak_bw}
        if too_slow:
            rows.append({**base, **_skip(f"Triton interpreter on CPU: batch*kv_heads*context > {INTERPRETER_MAX_WORK}")})
            continue
        if inputs.block_tables is None and sc.slab_block_size not in (None, cfg.block_size):
            rows.append({**base, "block_size": cfg.block_size, **_skip(
                f"a slab has no blocks: timed in the block_size={sc.slab_block_size} job "
                "(scenario.slab_block_size), not again at every block size")})
            continue
        # A kernel that writes into a caller's buffer gets one (NaN first: it must write every element);
        # one that makes its own output (SDPA) is timed alone, with no copy into a buffer.
        out = torch.full_like(q, float("nan")) if kernel.out_variant else None
        fn = lambda: kernel.decode(  # noqa: E731
            q, inputs.k_cache, inputs.v_cache, inputs.block_tables, inputs.context_lens, scale, out,
            max_context=context, **inputs.scale_kwargs())
        result = fn()
        ref = paged_decode_attention_ref(q, pool.k_cache, pool.v_cache, pool.tables[layout], pool.context_lens, scale,
                                         scales=pool.scales)
        err = (result.float() - ref.float()).abs().max().item()
        quant_err = None
        if quantized:
            exact = paged_decode_attention_ref(q, float_pool.k_cache, float_pool.v_cache, pool.tables[layout],
                                               pool.context_lens, scale)
            quant_err = (ref.float() - exact.float()).abs().max().item()
        # The interpreter runs a kernel's programs one by one in numpy: its time says nothing of the kernel's
        # (a row names it, kernel_backend=triton-interpreter), so one timed call after the checked one, which
        # warmed it, is enough (make sweep's kernel run spent 20 s on five interpreted calls a layout).
        warmup, iters = (0, 1) if kernel.interpreted else (sc.warmup, sc.iters)
        probe = probe_for(device.type)
        with probe or contextlib.nullcontext():
            t = time_call(fn, device, warmup, iters)
        sm_mhz, throttle = _clocks(device)  # right after the timed calls: the clock they ran at
        moved = attention_bytes(batch, context, *shape, elem, kv_elem,
                                scale_bytes_per_head(cfg.kv_dtype, cfg.kv_scale))
        bw = bandwidth_gbps(moved, t.median_s)
        method = f"{t.method}; interpreted: 1 timed call" if kernel.interpreted else t.method
        rows.append({**base, "status": "ok", "notes": method,
                     "latency_us_p50": t.median_s * 1e6, "latency_us_p10": t.p10_s * 1e6,
                     "latency_us_p90": t.p90_s * 1e6, "bytes_moved": moved,
                     "bandwidth_gbps": bw, "frac_copy_bw": bw / copy_bw,
                     "frac_peak_bw": bw / peak_bw if peak_bw else None, "max_abs_err": err,
                     "max_rel_err": err / max(ref.float().abs().max().item(), 1e-30),
                     "kv_quant_max_abs_err": quant_err,
                     "sm_clock_mhz": sm_mhz, "clock_throttle_reasons": throttle})
        if probe is not None:
            with_contention(rows[-1], probe.result())
    return rows
