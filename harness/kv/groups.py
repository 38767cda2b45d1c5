"""KV-cache groups: a model's layers grouped by attention kind, as each ``kv_manager`` lays them out.

A model declares each layer's attention kind (``ModelConfig.layer_types``; impls/attention_kinds.py says what
each kind keeps). The cache keeps a block table per group of layers of one kind:

- ``uniform``: one group of every layer, cached as full attention (the baseline; kvbench before groups). An
  MLA model's layers stay latent (every engine caches the latent; the same model cached as ordinary attention is
  a comparison figure, harness/kv/latent.py). A linear-attention layer has no K/V to cache in full: its state
  needs hybrid's grouped pool, and a run of such a model under uniform is refused (``state_refusal``).
- ``hybrid``: vLLM's hybrid manager (prefix caching: a hit every group holds, impls/group_prefix.py). One pool
  of one page size: each kind's layers are cut into groups of
  equal layer count ``group_size`` (the smallest kind's count, or the largest's when it is within 1.25x of
  it), so a page of any group spans ``group_size`` layers; a kind's last group may have fewer layers and its
  pages carry the rest as padding. Sliding groups free blocks as they leave the window.
- ``split_pools``: a static pool per kind (TensorRT-LLM, SGLang), one group each, the budget split by
  ``swa_full_tokens_ratio`` (``split_pool_bytes``); an admission needs room in both. Not for linear-attention
  layers (SGLang sizes its state pool by the running requests, which is not modelled): refused.
  Under every manager a linear layer keeps its kind (``LinearState``): the rows' ``kv_groups`` say what it is.

Linear-attention layers (Qwen3-Next) form groups of kind ``LinearState`` under hybrid, cut as the other kinds'
(one page size): a sequence holds its state's pages in each such group, the state padded to whole pages.

A model with one attention kind has one group under every manager: the same pool, the same rows.
Plain numbers only: config validation reads this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.harness.errors import ConfigError
from kvbench.harness.kv.latent import is_latent, linear_layers, state_tokens
from kvbench.harness.model.config import ModelConfig
from kvbench.impls.attention_kinds import (
    AttentionKind, FullAttention, LatentAttention, SlidingWindow, attention_kind, blocks_held, chunk_blocks,
)

KV_MANAGERS = ("uniform", "hybrid", "split_pools")
# vLLM's rule: kinds whose layer counts are within this factor share the largest count as the group size.
GROUP_SIZE_SLACK = 1.25


@dataclass(frozen=True)
class KVGroup:
    """Layers of one attention kind that share a block table per sequence."""

    kind: AttentionKind
    layers: tuple[int, ...]  # the model's layer indexes
    page_layers: int  # layers a page of this group spans (>= len(layers): the rest is padding)
    pool: int  # the pool its pages come from (hybrid: 0 for all; split_pools: one per kind)

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def layer_kinds(model: ModelConfig) -> list[AttentionKind]:
    """Each layer's attention kind; an unknown layer type is one error naming the layer and the kinds supported."""
    types = model.layer_types
    full = LatentAttention(model.kv_lora_rank, model.qk_rope_head_dim) if is_latent(model) else FullAttention()
    if types is None:
        return [full] * model.num_layers
    if len(types) != model.num_layers:
        raise ValueError(f"model={model.name}: layer_types has {len(types)} entries for num_layers={model.num_layers}")
    if all(t == "linear_attention" for t in types):  # the pool's slot is a caching layer's token
        raise ValueError(f"model={model.name}: every layer is linear_attention; kvbench sizes a state in token slots "
                         "of a layer that keeps K/V, so at least one layer must (full_attention or sliding_attention)")
    state = state_tokens(model) if "linear_attention" in types else None
    kinds = []
    for i, t in enumerate(types):
        try:
            kind = attention_kind(t, model.sliding_window, state)
        except ValueError as e:
            raise ValueError(f"model={model.name}: layer {i}: {e}") from None
        kinds.append(full if kind == FullAttention() else kind)
    return kinds


def _by_kind(model: ModelConfig, manager: str) -> dict[AttentionKind, list[int]]:
    """Layer indexes per kind, in order of first appearance (uniform: every sliding layer full)."""
    kinds = layer_kinds(model)
    if manager == "uniform":
        kinds = [FullAttention() if isinstance(k, SlidingWindow) else k for k in kinds]
    out: dict[AttentionKind, list[int]] = {}
    for i, k in enumerate(kinds):
        out.setdefault(k, []).append(i)
    # Kinds that keep tokens first (a pool's group 0 addresses a sequence's tokens: impls/group_pool.py ``slots``).
    return dict(sorted(out.items(), key=lambda item: item[0].state_tokens is not None))


def kv_groups(model: ModelConfig, manager: str) -> list[KVGroup]:
    """The model's KV-cache groups under ``manager`` (one of ``KV_MANAGERS``)."""
    if manager not in KV_MANAGERS:
        raise ValueError(f"kv_manager={manager!r} is not allowed; allowed: {', '.join(KV_MANAGERS)}")
    by_kind = _by_kind(model, manager)
    if len(by_kind) == 1 or manager == "split_pools":
        return [KVGroup(k, tuple(ls), len(ls), pool if manager == "split_pools" else 0)
                for pool, (k, ls) in enumerate(by_kind.items())]
    counts = [len(ls) for ls in by_kind.values()]
    size = max(counts) if max(counts) <= GROUP_SIZE_SLACK * min(counts) else min(counts)
    return [KVGroup(k, tuple(ls[i:i + size]), size, 0) for k, ls in by_kind.items() for i in range(0, len(ls), size)]


def state_refusal(model: ModelConfig, manager: str, cache: str) -> str | None:
    """Why a ``cache`` (an impl's ``cache``) under ``manager`` cannot hold ``model``'s linear-attention states,
    and what can; None if it can (or the model has none). Only hybrid's grouped pool holds a state: uniform pages
    every layer as full attention (its pool, the BlockManager, has no state), split_pools would need a static
    state pool sized by the running requests (SGLang's, not modelled), and a contiguous (or Orca) lane holds K/V
    only. kv_groups still lays such a model out under every manager (the rows' ``kv_groups``)."""
    if not linear_layers(model):
        return None
    if cache != "paged":
        why = f"impl.cache={cache}: its lanes hold K/V per token, no per-sequence state"
    elif manager == "uniform":
        why = "kv_manager=uniform caches every layer as full attention, and a linear_attention layer has no K/V"
    elif manager == "split_pools":
        why = "kv_manager=split_pools would need a static state pool sized by the running requests (not modelled)"
    else:
        return None
    return (f"model={model.name} has linear_attention layers (a fixed state per sequence): {why}; allowed: a paged "
            "impl (+impl=paged_torch, ...) with kv_manager=hybrid (a state group in the one pool, "
            "impls/attention_kinds.py LinearState)")


def groups_label(groups: list[KVGroup]) -> str:
    """The rows' ``kv_groups``: each kind's label and its layer count, e.g. ``full:10,sliding1024:52``."""
    counts: dict[str, int] = {}
    for g in groups:
        counts[g.kind.label] = counts.get(g.kind.label, 0) + g.num_layers
    full_first = sorted(counts, key=lambda label: label != FullAttention.label)  # stable: then as they appear
    return ",".join(f"{label}:{counts[label]}" for label in full_first)


def has_one_kind(model: ModelConfig) -> bool:
    """Every layer of one kind: every manager gives the one group (and today's rows)."""
    return len(set(layer_kinds(model))) == 1


@dataclass(frozen=True)
class SequenceHolding:
    """What one sequence holds in each group: pages, and bytes of real layers and of the pages."""

    pages: tuple[int, ...]  # per group
    page_bytes: int  # the pages' bytes, padding included (what the pool gives up)
    needed_bytes: int  # the K/V its next query reads, without block rounding or padding
    padding_bytes: int  # of page_bytes: hybrid's padded groups' layers that hold nothing

    @property
    def rounding_bytes(self) -> int:
        """Of page_bytes: slots of partly filled blocks and, in a sliding group, the tokens before the window
        that share a block with a token still in it (the other waste, beside padding)."""
        return self.page_bytes - self.needed_bytes - self.padding_bytes


def sequence_holding(groups: list[KVGroup], length: int, block_size: int, layer_bytes: int,
                     chunk_start: int | None = None) -> SequenceHolding:
    """A sequence of ``length`` tokens with every token written (or, with ``chunk_start``, while a chunk writes
    ``[chunk_start, length)``: its blocks before the chunk's first query's window are never allocated).
    ``layer_bytes``: K and V of one token in one layer (``layer_bytes_per_token``)."""
    if chunk_start is None:
        pages = tuple(blocks_held(g.kind, length, block_size) for g in groups)
    else:
        pages = tuple(chunk_blocks(g.kind, chunk_start, length, block_size) for g in groups)
    page_bytes = sum(p * block_size * g.page_layers * layer_bytes for p, g in zip(pages, groups))
    needed = sum(g.kind.tokens_needed(length) * g.num_layers * layer_bytes for g in groups)
    padding = sum(p * block_size * (g.page_layers - g.num_layers) * layer_bytes for p, g in zip(pages, groups))
    return SequenceHolding(pages, page_bytes, needed, padding)


def pool_layers(groups: list[KVGroup]) -> list[int]:
    """Each pool's page layers (pools in order; a pool's groups share one page size)."""
    out: dict[int, int] = {}
    for g in groups:
        if out.setdefault(g.pool, g.page_layers) != g.page_layers:
            raise ValueError(f"pool {g.pool}'s groups have different page sizes")
    return [out[p] for p in sorted(out)]


def split_pool_bytes(groups: list[KVGroup], kv_bytes: int, ratio: float, layer_bytes: int) -> list[int]:
    """split_pools' budget per pool: a sliding pool holds ``ratio`` tokens for every token of the full pool
    (SGLang's ``swa_full_tokens_ratio``); one pool (one kind) takes it all."""
    if any(g.kind.state_tokens is not None for g in groups):
        raise ConfigError("kv_manager=split_pools with linear_attention layers would need a static state pool sized "
                          "by the running requests (not modelled); allowed: kv_manager=hybrid")
    layers = pool_layers(groups)
    if len(layers) == 1:
        return [kv_bytes]
    weights = [(1.0 if g.kind.window is None else ratio) for g in groups]
    per_full_token = sum(w * n * layer_bytes for w, n in zip(weights, layers))
    tokens = kv_bytes / per_full_token
    return [int(tokens * w * n * layer_bytes) for w, n in zip(weights, layers)]


def layer_bytes_per_token(model: ModelConfig, dtype: str, kv_dtype: str = "auto", kv_scale: str = "tensor") -> int:
    """What one token keeps in one caching layer (every such layer has the same shape: K and V, or MLA's latent):
    ``kv_bytes_per_token`` over the layers that keep tokens (a linear layer keeps none: its state is counted in
    these slots, ``LinearState.state_tokens``)."""
    from kvbench.harness.kv.latent import cached_layers
    from kvbench.harness.kv.sizes import kv_bytes_per_token

    return kv_bytes_per_token(model, dtype, kv_dtype, kv_scale) // cached_layers(model)


# Managers whose grouped pool caches prefixes (impls/group_prefix.py). split_pools does not: its pools are
# sized apart by a fixed ratio, so a prefix its full pool holds is often gone from its sliding pool, and
# neither TensorRT-LLM's per-window pools nor SGLang's SWA pool are modelled with their own reuse rules here.
PREFIX_CACHING_MANAGERS = ("uniform", "hybrid")


def prefix_caching_refusal(manager: str, model_name: str) -> str:
    """Why ``manager``'s grouped pool cannot prefix-cache ``model_name``, and the ways to run it."""
    return (f"kv_manager={manager} with impl.prefix_caching=true on model={model_name} (layers of several attention "
            "kinds) is not supported: its pools are sized apart, so a hit held by every group is not modelled; "
            "allowed with prefix caching: kv_manager in {" + ", ".join(PREFIX_CACHING_MANAGERS) + "}; or add "
            "impl.prefix_caching=false (paging without prefix reuse)")
