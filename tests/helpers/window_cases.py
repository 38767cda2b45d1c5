"""Sliding-window cases shared by every kernel's window tests.

A window is a kernel argument (kernels/reference.py): the query at position ``p = context_len - 1``
reads keys ``p - window + 1 .. p``. ``naive_window_decode`` states that rule directly, one sequence at
a time over ``gather_kv``'s rows, so the reference is checked against it and every kernel against the
reference, on the same fresh random inputs (tests/helpers/kernel_cases.py).
"""

from __future__ import annotations

import torch

from kvbench.impls.base import KVCache, PrefillSpan
from kvbench.kernels.reference import gather_kv, paged_decode_attention_ref
from tests.helpers.kernel_cases import DecodeKernel, assert_close_for_dtype, make_decode_inputs

# Context lengths against windows: a single token, a window shorter than, equal to and longer than a
# context, and windows that are not a multiple of any block size.
WINDOW_LENS = [1, 5, 16, 17, 54, 97]
WINDOWS = [1, 5, 16, 17, 24, 200]


def naive_window_decode(q, k_cache, v_cache, block_tables, context_lens, scale, window) -> torch.Tensor:
    """Each sequence's query over its last ``window`` keys (all when ``window`` <= 0), in fp32, by loops."""
    out = torch.empty(q.shape, dtype=torch.float32)
    group = q.shape[1] // k_cache.shape[2]
    for b, n in enumerate(context_lens.tolist()):
        first = max(0, n - window) if window > 0 else 0
        k = gather_kv(k_cache, block_tables[b], n)[first:].float()
        v = gather_kv(v_cache, block_tables[b], n)[first:].float()
        for h in range(q.shape[1]):
            probs = torch.softmax((k[:, h // group] @ q[b, h].float()) * scale, dim=0)
            out[b, h] = probs @ v[:, h // group]
    return out


def check_window_decode(kernel: DecodeKernel, lens, window, kv_heads, group, head_dim, block_size, dtype,
                        seed=0, **kernel_options) -> None:
    """``kernel(..., window=window)`` fills a NaN-filled ``out`` with the fp32 reference's windowed result."""
    q, k_cache, v_cache, tables, lens_t = make_decode_inputs(
        lens, kv_heads, group, head_dim, block_size, dtype, seed=seed)
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))
    got = kernel(q, k_cache, v_cache, tables, lens_t, scale, out=out, window=window, **kernel_options)
    assert got is out
    assert not torch.isnan(out).any(), "output rows left unwritten"
    want = paged_decode_attention_ref(q.float(), k_cache.float(), v_cache.float(), tables, lens_t, scale,
                                      window=window)
    assert_close_for_dtype(out, want, dtype)
    if 0 < window < max(lens):  # the window changed something: a kernel that ignores it cannot pass
        full = paged_decode_attention_ref(q.float(), k_cache.float(), v_cache.float(), tables, lens_t, scale)
        assert not torch.allclose(want, full, atol=1e-3)


def naive_window_attention(q, k, v, scale, window) -> torch.Tensor:
    """q ``[T, H, D]``: the last ``T`` positions of keys ``k``/``v`` ``[L, KVH, D]``; query ``i`` at position
    ``p = L - T + i`` sees keys ``p - window < j <= p`` (every ``j <= p`` when ``window`` <= 0), by loops."""
    t, length = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for i in range(t):
        p = length - t + i
        first = max(0, p - window + 1) if window > 0 else 0
        for h in range(q.shape[1]):
            kh, vh = k[first:p + 1, h // group], v[first:p + 1, h // group]
            out[i, h] = torch.softmax((kh @ q[i, h]) * scale, dim=0) @ vh
    return out


def check_cache_windows(cache: KVCache, windows: list[int], prompts: list[int], steps: int, chunk: int,
                        seed: int = 0, sinks: list[torch.Tensor | None] | None = None) -> None:
    """Drive ``cache`` as an engine does, with random q/k/v in every layer: prompts prefilled together in chunks
    of at most ``chunk`` tokens each, then ``steps`` decode steps of the whole batch; every output equals
    ``naive_window_attention`` over that sequence's keys so far, with its layer's window. ``sinks`` (one entry
    a layer, None: none there): set on the cache too, and each output is ``naive_sink_attention``'s."""
    cache.set_layer_windows(windows)
    if sinks is not None:
        from tests.helpers.sink_cases import naive_sink_attention  # it imports this module

        cache.set_layer_sinks(sinks)
    alloc, heads = cache.allocator, cache.num_heads
    kv_heads, dim = cache.k[0].shape[2:]
    gen = torch.Generator().manual_seed(seed)
    keys = {(layer, s): [] for layer in range(len(windows)) for s in range(len(prompts))}
    values = {key: [] for key in keys}

    def attend(layer, spans_rows, forward, meta):
        rows = sum(n for _, n in spans_rows)
        q = torch.randn(rows, heads, dim, generator=gen)
        k, v = torch.randn(rows, kv_heads, dim, generator=gen), torch.randn(rows, kv_heads, dim, generator=gen)
        out, first = forward(layer, q, k, v, meta), 0
        for s, n in spans_rows:
            keys[layer, s].append(k[first:first + n])
            values[layer, s].append(v[first:first + n])
            ks, vs = torch.cat(keys[layer, s]), torch.cat(values[layer, s])
            if sinks is None:
                want = naive_window_attention(q[first:first + n], ks, vs, cache.scale, windows[layer])
            else:
                want = naive_sink_attention(q[first:first + n], ks, vs, cache.scale, windows[layer], sinks[layer])
            torch.testing.assert_close(out[first:first + n], want, atol=1e-5, rtol=1e-5)
            first += n

    for s, n in enumerate(prompts):
        alloc.admit(s, alloc.plan_admit([1000 * s + i for i in range(n)], total_len=n + steps))  # shares nothing
    done = [0] * len(prompts)
    while any(d < n for d, n in zip(done, prompts)):
        spans = [PrefillSpan(s, d, min(d + chunk, n)) for s, (d, n) in enumerate(zip(done, prompts)) if d < n]
        meta = cache.prepare_prefill(spans)
        for layer in range(len(windows)):
            attend(layer, [(sp.seq_id, sp.num_tokens) for sp in spans], cache.forward_prefill, meta)
        for sp in spans:
            done[sp.seq_id] = sp.end
    seq_ids = list(range(len(prompts)))
    for _ in range(steps):
        for s in seq_ids:
            alloc.append(s, [0])
        meta = cache.prepare_decode(seq_ids)
        for layer in range(len(windows)):
            attend(layer, [(s, 1) for s in seq_ids], cache.forward_decode, meta)
