"""KV-cache groups: a model's layers grouped by attention kind, as each ``kv_manager`` lays them out.

A model declares each layer's attention kind (``ModelConfig.layer_types``; impls/attention_kinds.py says what
each kind keeps). The cache keeps a block table per group of layers of one kind:

- ``uniform``: one group of every layer, cached as full attention (the baseline; kvbench before groups).
- ``hybrid``: vLLM's hybrid manager (prefix caching: a hit every group holds, impls/group_prefix.py). One pool
  of one page size: each kind's layers are cut into groups of
  equal layer count ``group_size`` (the smallest kind's count, or the largest's when it is within 1.25x of
  it), so a page of any group spans ``group_size`` layers; a kind's last group may have fewer layers and its
  pages carry the rest as padding. Sliding groups free blocks as they leave the window.
- ``split_pools``: a static pool per kind (TensorRT-LLM, SGLang), one group each, the budget split by
  ``swa_full_tokens_ratio`` (``split_pool_bytes``); an admission needs room in both.

A model with one attention kind has one group under every manager: the same pool, the same rows.
Plain numbers only: config validation reads this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.harness.model.config import ModelConfig
from kvbench.impls.attention_kinds import AttentionKind, FullAttention, attention_kind, blocks_held, chunk_blocks

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
    if types is None:
        return [FullAttention()] * model.num_layers
    if len(types) != model.num_layers:
        raise ValueError(f"model={model.name}: layer_types has {len(types)} entries for num_layers={model.num_layers}")
    kinds = []
    for i, t in enumerate(types):
        try:
            kinds.append(attention_kind(t, model.sliding_window))
        except ValueError as e:
            raise ValueError(f"model={model.name}: layer {i}: {e}") from None
    return kinds


def _by_kind(model: ModelConfig, manager: str) -> dict[AttentionKind, list[int]]:
    """Layer indexes per kind, in order of first appearance (uniform: every layer full)."""
    kinds = layer_kinds(model)
    if manager == "uniform":
        kinds = [FullAttention()] * model.num_layers
    out: dict[AttentionKind, list[int]] = {}
    for i, k in enumerate(kinds):
        out.setdefault(k, []).append(i)
    return out


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
    layers = pool_layers(groups)
    if len(layers) == 1:
        return [kv_bytes]
    weights = [(1.0 if g.kind.window is None else ratio) for g in groups]
    per_full_token = sum(w * n * layer_bytes for w, n in zip(weights, layers))
    tokens = kv_bytes / per_full_token
    return [int(tokens * w * n * layer_bytes) for w, n in zip(weights, layers)]


def layer_bytes_per_token(model: ModelConfig, dtype: str, kv_dtype: str = "auto", kv_scale: str = "tensor") -> int:
    """K and V of one token in one layer (every layer has the same shape): ``kv_bytes_per_token`` / layers."""
    from kvbench.harness.kv.sizes import kv_bytes_per_token

    return kv_bytes_per_token(model, dtype, kv_dtype, kv_scale) // model.num_layers


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
