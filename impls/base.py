"""The tensor half of the KV-cache interface (the bookkeeping half is impls/allocator.py).

A ``KVCache`` writes K/V of one layer and attends, for a prefill of every prompt
admitted in a step (one varlen batch, ``forward_prefill``) or a decode step over the
whole batch (``forward_decode``). Its ``prepare_*`` put the step's integers in the
step's ``StagingBuffer`` (impls/staging.py), which the caller may have filled with its
own first, and upload it: one copy per step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from kvbench.impls.allocator import KVAllocator, SlotCopy
from kvbench.impls.host_tier import HostCopies
from kvbench.impls.staging import StagingBuffer
from kvbench.kernels.kv_formats import is_quantized
from kvbench.kernels.quant import KVScales, calibrate, dequantize, storage_dtype, write_quantized_ref

def layer_windows(layer_types: Sequence[str] | None, sliding_window: int | None) -> list[int] | None:
    """A model's ``KVCache.set_layer_windows`` from its config (``ModelConfig.layer_types``, ``sliding_window``):
    ``sliding_window`` for a sliding_attention layer, 0 for a full_attention one; None when every layer is full."""
    if layer_types is None or "sliding_attention" not in layer_types:
        return None
    return [sliding_window if kind == "sliding_attention" else 0 for kind in layer_types]


@dataclass(frozen=True)
class PrefillSpan:
    """Positions ``[start, end)`` of sequence ``seq_id`` to compute; ``[0, start)`` is cached."""

    seq_id: int
    start: int
    end: int

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


def query_slices(spans: Sequence[PrefillSpan]) -> list[slice]:
    """Each span's query rows of a prefill batch, whose new tokens are concatenated in span order."""
    out: list[slice] = []
    first = 0
    for span in spans:
        out.append(slice(first, first + span.num_tokens))
        first += span.num_tokens
    return out


@dataclass(frozen=True)
class StateRows:
    """One linear-attention layer's per-sequence state for one step (``KVCache.linear_state``), the narrow
    interface between a state-keeping layer (harness/model/gated_delta.py) and the cache that holds its state.

    ``lengths``: each sequence's rows of the step's flat batch, in row order (a decode's 1). ``read()`` gives one
    flat row of ``capacity`` values per sequence, in the cache's dtype: the sequence's state as the last step left
    it, zeros at its first write (a new or recomputed sequence); the layer decides how its state is laid out in
    the row. ``write(rows)`` stores ``[N, <= capacity]`` values back (the rest of the region zeroed). A paged
    grouped cache keeps these values in the sequence's state pages of the pool (impls/state_pages.py)."""

    lengths: tuple[int, ...]
    capacity: int
    read: Callable[[], torch.Tensor]
    write: Callable[[torch.Tensor], None]

    @staticmethod
    def join(parts: Sequence[StateRows]) -> StateRows:
        """Several parts of one step (a mixed step's decodes, then its prompt chunks) as one, rows in order."""
        if len(parts) == 1:
            return parts[0]
        counts = [len(p.lengths) for p in parts]
        if len({p.capacity for p in parts}) != 1:
            raise ValueError(f"the parts of a step hold one state size, got {[p.capacity for p in parts]}")

        def write(rows: torch.Tensor) -> None:
            for part, chunk in zip(parts, rows.split(counts)):
                part.write(chunk)

        return StateRows(tuple(n for p in parts for n in p.lengths), parts[0].capacity,
                         lambda: torch.cat([p.read() for p in parts]), write)


# Copies that start on a block boundary and fit in one block go block by block up to this
# block length (a paged pool's copy-on-write); longer blocks (a contiguous slab's
# lanes of max_seq_len slots) copy only the slots asked for.
WHOLE_BLOCK_COPY_MAX = 128


def apply_slot_copies(stores: Sequence[torch.Tensor], copies: Sequence[SlotCopy]) -> None:
    """Do ``copies`` in every store (``[blocks, block_len, kv_heads, head_dim]``, or a quantized
    store's per-token scales ``[blocks, block_len, kv_heads]``).

    A copy-on-write copy fills the start of a fresh block, so it is done by block index: the
    whole block is copied, and its slots past ``num_slots`` (beyond the sequence's length, read
    by nothing until written) come along. Other copies go by slot index, built without a
    Python loop over slots.
    """
    if not copies:
        return
    device = stores[0].device
    block_len = stores[0].shape[1]
    by_block = [c for c in copies if block_len <= WHOLE_BLOCK_COPY_MAX and c.src % block_len == 0
                and c.dst % block_len == 0 and c.num_slots <= block_len]
    by_slot = [c for c in copies if c not in by_block]
    if by_block:
        src_b = torch.tensor([c.src // block_len for c in by_block], device=device)
        dst_b = torch.tensor([c.dst // block_len for c in by_block], device=device)
        for store in stores:
            store[dst_b] = store[src_b]
    if by_slot:
        lens = torch.tensor([c.num_slots for c in by_slot])
        offsets = torch.arange(int(lens.sum())) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
        src = (torch.repeat_interleave(torch.tensor([c.src for c in by_slot]), lens) + offsets).to(device)
        dst = (torch.repeat_interleave(torch.tensor([c.dst for c in by_slot]), lens) + offsets).to(device)
        for store in stores:
            flat = store.view(-1, *store.shape[2:])
            flat[dst] = flat[src]


class KVCache(ABC):
    """Tensors of one implementation. The engine only calls these methods.

    Every layer has a K and a V store of ``[num_blocks, block_len, kv_heads, head_dim]``:
    a contiguous slab is ``[lanes, max_seq_len, ...]``, a paged pool ``[blocks, block_size, ...]``.
    """

    def __init__(
        self,
        allocator: KVAllocator,
        num_blocks: int,
        block_len: int,
        *,
        num_layers: int,
        num_heads: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        bytes_per_token: int,
        kv_dtype: str = "auto",
        kv_scale: str = "tensor",
        scale: float | None = None,
        latent: bool = False,
    ) -> None:
        self.allocator = allocator
        # MLA's latent (harness/model/deepseek.py): one kv head whose key and value are the same stored vector, so
        # the V store IS the K store (``self.v[l] is self.k[l]``, its scales too): the bytes are the latent's, once.
        # Every kernel attends as over any K/V pool; the model keeps the output's first kv_lora_rank values. The
        # one cost: a write stores the rows twice into the same memory (the kernels' write takes K and V).
        self.latent = latent
        self.bytes_per_token = bytes_per_token
        self.device = device
        # The softmax scale of every layer's attention: the model's (ModelConfig.softmax_scale), else head_dim ** -0.5.
        self.scale = head_dim**-0.5 if scale is None else scale
        self.num_heads = num_heads  # query heads (kernels are warmed up with real q shapes)
        shape = (num_blocks, block_len, kv_heads, head_dim)
        # Zeroed, not empty: attention reads slots past a sequence's length (masked out),
        # and a NaN left in recycled memory would survive the mask (0 * NaN = NaN).
        self.dtype = dtype  # the model's: what attention computes in
        self.kv_dtype = kv_dtype
        store = storage_dtype(kv_dtype) if is_quantized(kv_dtype) else dtype
        self.k = [torch.zeros(shape, dtype=store, device=device) for _ in range(num_layers)]
        self.v = list(self.k) if latent else [torch.zeros(shape, dtype=store, device=device) for _ in range(num_layers)]
        # A quantized store's scales per layer (kernels/quant.py); static ones are set by the layer's
        # first write (``layer_scales``), a host flag per layer, so no step reads the device.
        self.scales: list[KVScales] | None = None
        self._calibrated = [False] * num_layers
        # Each layer's sliding window in tokens, 0 for a full-attention layer (``set_layer_windows``): its
        # kernels mask keys older than the window; every block stays kept (the window masks, frees nothing).
        self.windows = [0] * num_layers
        # Each layer's attention sinks (``set_layer_sinks``, kernels/sinks.py): float32 [num_heads] on the device,
        # None for a layer without (its kernels are called as before, with no ``sinks`` argument).
        self.sinks: list[torch.Tensor | None] = [None] * num_layers
        if is_quantized(kv_dtype):
            self.scales = [KVScales.allocate(kv_scale, shape, device) for _ in range(num_layers)]
            if latent:  # the latent's one scale (a tensor's, or a token's): K's and V's are the same rows
                self.scales = [KVScales(sc.k, sc.k, sc.dynamic) for sc in self.scales]

    def set_layer_windows(self, windows: Sequence[int]) -> None:
        """Each layer's sliding window (``layer_windows``; 0: full attention), before the first step."""
        if len(windows) != len(self.windows) or any(not isinstance(w, int) or w < 0 for w in windows):
            raise ValueError(f"windows must be {len(self.windows)} ints >= 0 (0: full attention), one a layer; "
                             f"got {list(windows)!r}")
        self.windows = list(windows)

    def set_layer_sinks(self, sinks: Sequence[torch.Tensor | None]) -> None:
        """Each layer's attention sinks (gpt-oss: a learned logit per query head in every softmax's denominator),
        None for a layer without, before the first step; kept as float32 on the cache's device."""
        if len(sinks) != len(self.sinks):
            raise ValueError(f"sinks must be {len(self.sinks)} entries, one a layer (a float tensor [num_heads="
                             f"{self.num_heads}] or None), got {len(sinks)}")
        kept: list[torch.Tensor | None] = []
        for layer, s in enumerate(sinks):
            if s is not None and not (isinstance(s, torch.Tensor) and s.is_floating_point()
                                      and tuple(s.shape) == (self.num_heads,)):
                got = f"{s.dtype} {tuple(s.shape)}" if isinstance(s, torch.Tensor) else repr(s)
                raise ValueError(f"sinks[{layer}] must be a float tensor [num_heads={self.num_heads}] or None, "
                                 f"got {got}")
            kept.append(None if s is None else s.detach().to(self.device, torch.float32).contiguous())
        self.sinks = kept

    def attention_options(self, layer: int) -> dict:
        """A layer's ``window`` and ``sinks`` kernel arguments, each only where the layer has one: a full-attention
        layer without sinks calls its kernels as before either existed."""
        window, sinks = self.windows[layer], self.sinks[layer]
        return {**({"window": window} if window else {}), **({"sinks": sinks} if sinks is not None else {})}

    def layer_scales(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> KVScales | None:
        """This layer's scales for a write of ``k``/``v`` (None: a float store); a static scale
        is calibrated from the first write's amax (the first prefill's)."""
        if self.scales is None:
            return None
        scales = self.scales[layer]
        if not scales.dynamic and not self._calibrated[layer]:
            calibrate(scales, k, v, self.k[layer].dtype)
            self._calibrated[layer] = True
        return scales

    def read(self, layer: int, index, flat: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's K and V at ``index`` (over the stores' leading axes; ``flat``: over slots),
        in the model's dtype: a quantized store is dequantized here, inside the timed step."""
        out = []
        for store, scale in ((self.k[layer], None if self.scales is None else self.scales[layer].k),
                             (self.v[layer], None if self.scales is None else self.scales[layer].v)):
            if flat:
                store = store.view(-1, *store.shape[2:])
                scale = scale.view(-1, scale.shape[-1]) if scale is not None and scale.dim() else scale
            rows = store[index]
            if scale is None:
                out.append(rows)
            else:
                out.append(dequantize(rows, scale[index] if scale.dim() else scale, self.dtype))
        return out[0], out[1]
    @abstractmethod
    def prepare_prefill(self, spans: Sequence[PrefillSpan], staging: StagingBuffer | None = None) -> Any:
        """Metadata for one forward over every span's new tokens, concatenated in span order.

        Adds the cache's fields to ``staging`` (a new buffer if None) and uploads it.
        """

    @abstractmethod
    def prepare_decode(self, seq_ids: Sequence[int], staging: StagingBuffer | None = None) -> Any:
        """Metadata for one new token per sequence (its slot already appended).

        Adds the cache's fields to ``staging`` (a new buffer if None) and uploads it.
        """

    # The engine knows which kind of step it runs, so it calls the matching method with
    # that step's metadata: no per-layer check of the metadata's type.
    @abstractmethod
    def forward_prefill(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: Any
    ) -> torch.Tensor:
        """Store this layer's new K/V of a prefill (``prepare_prefill``'s ``meta``) and attend:
        q ``[T, H, D]`` -> ``[T, H, D]``, each prompt over its own context."""

    @abstractmethod
    def forward_decode(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: Any
    ) -> torch.Tensor:
        """Store this layer's new K/V of a decode step (``prepare_decode``'s ``meta``) and attend:
        q ``[B, H, D]`` -> ``[B, H, D]``, one token per sequence."""

    def write_flat(self, layer: int, k: torch.Tensor, v: torch.Tensor,
                   slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens' K/V at their flat slots (a torch scatter; quantized for a quantized
        store); return this layer's stores as views ``[slots, kv_heads, head_dim]`` (the caches
        that attend with SDPA; a quantized store's they read through ``read``)."""
        k_flat, v_flat = (store.view(-1, *store.shape[2:]) for store in (self.k[layer], self.v[layer]))
        scales = self.layer_scales(layer, k, v)
        if scales is not None:
            write_quantized_ref(k, v, self.k[layer], self.v[layer], slot_mapping, scales)
            return k_flat, v_flat
        k_flat[slot_mapping] = k
        if not self.latent:  # a latent's V store is its K store, written above
            v_flat[slot_mapping] = v
        return k_flat, v_flat

    def linear_state(self, layer: int, meta: Any) -> StateRows:
        """Linear-attention layer ``layer``'s state rows for the step ``meta`` (a ``prepare_*``'s) describes:
        only a cache with state groups holds one (impls/grouped_paged.py under kv_manager=hybrid)."""
        raise NotImplementedError(f"{type(self).__name__} holds no linear-attention state (layer {layer}): a "
                                  "linear_attention layer needs a paged impl with kv_manager=hybrid")

    def warmup(self) -> None:
        """Compile every kernel variant a run can meet, before anything is timed (default: none)."""

    def counters(self) -> dict[str, int]:
        """Impl-specific event counts over the cache's life, as row columns (none by default)."""
        return {}

    def copy_slots(self, copies: Sequence[SlotCopy]) -> None:
        apply_slot_copies(self.block_stores(), copies)  # scales travel with rows

    def block_stores(self) -> list[torch.Tensor]:
        """Every per-block store, ``[blocks, block_len, ...]``: K and V of every layer, and a quantized
        cache's per-token scales (a static scale is one per layer, set once: no block's own). What a
        copy-on-write and the host tier copy."""
        if self.latent:  # the V stores and scales are the K ones: copied once
            return [*self.k, *(sc.k for sc in self.scales or () if sc.dynamic)]
        dynamic = [t for sc in self.scales or () if sc.dynamic for t in (sc.k, sc.v)]
        return [*self.k, *self.v, *dynamic]

    def copy_host(self, copies: HostCopies) -> None:
        """A host tier's copies (impls/host_tier.py), stores first; only a paged cache has a tier."""
        if copies:
            raise NotImplementedError(f"{type(self).__name__} has no host tier")


class StepAttention:
    """What a model's layers call during one forward (harness/serving/engine.py builds one a step): ``(layer, q,
    k, v) -> out`` attends through the cache's ``forward_prefill`` or ``forward_decode`` with the step's metadata,
    and ``linear_state(layer)`` gives a linear-attention layer its sequences' state (``StateRows``).

    ``parts``: ``(forward, meta, rows)`` in row order; a mixed step has two (its decodes' ``rows``, then its prompt
    chunks', ``rows`` None: the rest), and each attends its own rows of q, k and v."""

    def __init__(self, cache: KVCache, parts: Sequence[tuple[Callable[..., torch.Tensor], Any, int | None]]) -> None:
        self.cache, self.parts = cache, list(parts)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if len(self.parts) == 1:
            forward, meta, _ = self.parts[0]
            return forward(layer, q, k, v, meta)
        outs, first = [], 0
        for forward, meta, rows in self.parts:
            end = q.shape[0] if rows is None else first + rows
            outs.append(forward(layer, q[first:end], k[first:end], v[first:end], meta))
            first = end
        return torch.cat(outs)

    def linear_state(self, layer: int) -> StateRows:
        return StateRows.join([self.cache.linear_state(layer, meta) for _, meta, _ in self.parts])
