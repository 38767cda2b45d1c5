"""scenario=kernel: decode attention alone, per impl, over batch x context x block size.

Fresh random caches (larger than the L2 cache on GPU), shuffled block tables for
the paged layout and identity tables for a "contiguous" layout read by the same
paged kernel, torch SDPA over a contiguous slab for the contiguous impl. Reports
median latency and effective bandwidth (bytes of K, V, Q and output / time) as a
fraction of the peak and of a device-to-device copy measured in the same run.
"""

from __future__ import annotations

import os

import torch

from harness.config import ImplConfig
from harness.context import RunContext
from harness.measure.bandwidth import peak_bandwidth_gbps
from harness.measure.timing import copy_bandwidth_gbps, time_call
from harness.metrics import attention_bytes, bandwidth_gbps
from kernels.reference import paged_decode_attention_ref
from kernels.sdpa import grouped_sdpa
from impls.sizing import blocks_for_tokens

L2_FLUSH_BYTES = 256 * 2**20  # GPU pools at least this big, so K/V come from HBM, not L2
# The Triton interpreter runs programs one by one in numpy: bound the work per call on CPU.
INTERPRETER_MAX_WORK = 2**16  # batch * kv_heads * context


def _skip(reason: str) -> dict:
    return {"status": "skipped", "error": reason}


def _inputs(batch: int, context: int, block_size: int, shape: tuple[int, int, int], dtype, device, gen):
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
    return q, k_cache, v_cache, {"paged": shuffled, "contiguous": identity}, lens


def _sdpa_call(q, k_cache, v_cache, table, context, scale):
    """Contiguous impl: SDPA over a [B, L, KVH, D] slab (the blocks of the identity layout)."""
    batch = q.shape[0]
    k = k_cache[: table.numel()].reshape(batch, -1, *k_cache.shape[2:])[:, :context]
    v = v_cache[: table.numel()].reshape(batch, -1, *v_cache.shape[2:])[:, :context]
    kh, vh, qh = k.transpose(1, 2), v.transpose(1, 2), q.unsqueeze(2)
    return lambda: grouped_sdpa(qh, kh, vh, scale).squeeze(2)


def run(ctx: RunContext, impl: ImplConfig) -> list[dict]:
    from kernels.registry import get_paged_kernel

    cfg, sc, device = ctx.cfg, ctx.cfg.scenario, ctx.device
    if impl.reservation != "max":
        # A reservation policy changes memory, not the kernel: the contiguous impl's rows time SDPA.
        return [_skip(f"impl.reservation={impl.reservation}: a memory policy over the contiguous impl's SDPA; "
                      "see the contiguous rows")]
    dtype = ctx.dtype
    shape = (sc.num_heads, sc.num_kv_heads, sc.head_dim)
    scale = sc.head_dim**-0.5
    elem = torch.finfo(dtype).bits // 8
    if "copy_bw_gbps" not in ctx.memo:
        ctx.memo["copy_bw_gbps"] = copy_bandwidth_gbps(device, 1 << 30 if device.type == "cuda" else 1 << 27)
    copy_bw = ctx.memo["copy_bw_gbps"]
    peak_bw = peak_bandwidth_gbps(device)
    kernel = get_paged_kernel(impl.kernel) if impl.cache == "paged" else None
    interpreted = impl.kernel == "triton" and os.environ.get("TRITON_INTERPRET") == "1"
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    rows = []
    block_sizes = sc.block_sizes if impl.cache == "paged" else [max(sc.block_sizes)]
    for batch in sc.batches:
        for context in sc.contexts:
            for block_size in block_sizes:
                q, k_cache, v_cache, tables, lens = _inputs(batch, context, block_size, shape, dtype, device, gen)
                layouts = ("paged", "contiguous") if kernel else ("contiguous",)
                for layout in layouts:
                    base = {"layout": layout, "kernel_batch": batch, "context_len": context,
                            "block_size": block_size if kernel else None, "num_heads": shape[0],
                            "num_kv_heads": shape[1], "head_dim": shape[2], "copy_bw_gbps": copy_bw,
                            "peak_bw_gbps": peak_bw}
                    if interpreted and batch * shape[1] * context > INTERPRETER_MAX_WORK:
                        rows.append({**base, **_skip(
                            f"Triton interpreter on CPU: batch*kv_heads*context > {INTERPRETER_MAX_WORK}")})
                        continue
                    table = tables[layout]
                    if kernel:
                        out = torch.full_like(q, float("nan"))
                        fn = lambda: kernel.decode(  # noqa: E731
                            q, k_cache, v_cache, table, lens, scale, out, max_context=context)
                    else:
                        fn = _sdpa_call(q, k_cache, v_cache, table, context, scale)
                    result = fn()
                    ref = paged_decode_attention_ref(q, k_cache, v_cache, table, lens, scale)
                    err = (result.float() - ref.float()).abs().max().item()
                    t = time_call(fn, device, sc.warmup, sc.iters)
                    moved = attention_bytes(batch, context, *shape, elem)
                    bw = bandwidth_gbps(moved, t.median_s)
                    rows.append({**base, "status": "ok", "notes": t.method,
                                 "latency_us_p50": t.median_s * 1e6, "latency_us_p10": t.p10_s * 1e6,
                                 "latency_us_p90": t.p90_s * 1e6, "bytes_moved": moved,
                                 "bandwidth_gbps": bw, "frac_copy_bw": bw / copy_bw,
                                 "frac_peak_bw": bw / peak_bw if peak_bw else None, "max_abs_err": err})
                del q, k_cache, v_cache, tables
    return rows
