"""What a step reads of a model whose layers are not all alike: sliding-window layers and mixtures of experts.

The roofline (harness/serving/cost_model.py) prices a decode step's attention by the KV tokens it reads and its
matmuls by the weights it reads. Two kinds of layer read less than "every token" and "every weight":

- **A sliding layer reads at most its window.** A sequence of context ``c`` reads ``min(c, W)`` tokens of each
  layer with window ``W`` (the kernels skip the blocks before the window, under every ``kv_manager``: the window is
  what attention reads, whatever the pool keeps). The clock knows a step's batch ``B`` and the sum of its contexts
  ``R``, not each context, so it reads ``B * min(R / B, W)`` for such a layer: exact when the contexts are equal,
  and never more than the full read. A step of mixed contexts, some shorter than the window, is read at most
  ``min(R, B * W)`` where the exact figure is ``sum(min(c_i, W))`` (which is smaller).
- **A prompt's attention is quadratic, a sliding layer's capped.** A step that computes positions ``[start, end)``
  of a prompt attends each position ``p`` to its ``p + 1`` keys (causal), at most ``W`` in a layer with window
  ``W``: ``prefill_pairs`` sums those (query, key) pairs, the earlier chunks' and prefix-cache hits' keys included.
- **An MoE layer reads the experts its batch routes to.** ``T`` tokens each choosing ``k`` of ``E`` experts
  (uniformly, as a balanced router aims for) touch ``E * (1 - (1 - k/E) ** T)`` distinct experts on average: one
  token reads ``k``, a large batch all ``E``. The weights read are the dense part plus those experts; the FLOPs are
  the active parameters' (``k`` experts a token), not all of them.

Plain numbers only (no torch): the clock prices millions of steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.harness.kv.latent import LINEAR_ATTENTION


@dataclass(frozen=True)
class WindowShare:
    """The fraction of a model's layers (by KV bytes) that slide with ``window`` tokens."""

    window: int
    fraction: float


def window_shares(layer_types: list[str] | None, sliding_window: int | None) -> tuple[WindowShare, ...]:
    """The sliding layers' share of the model's KV bytes, per window (every caching layer caches the same bytes a
    token; a linear-attention layer caches none, so it is no part of the share); empty for a model whose every layer
    attends to all its context."""
    if not layer_types or sliding_window is None:
        return ()
    sliding = sum(kind == "sliding_attention" for kind in layer_types)
    caching = sum(kind != LINEAR_ATTENTION for kind in layer_types)
    return (WindowShare(sliding_window, sliding / caching),) if sliding else ()


def windowed_read(shares: tuple[WindowShare, ...], batch: int, tokens: float) -> float:
    """KV tokens (of every layer) a decode step of ``batch`` sequences whose contexts sum to ``tokens`` reads."""
    if not shares or batch <= 0:
        return tokens
    mean = tokens / batch
    read = tokens
    for s in shares:
        if mean > s.window:
            read -= s.fraction * batch * (mean - s.window)
    return read


def windowed_read_over_steps(shares: tuple[WindowShare, ...], batch: int, tokens: float, steps: int) -> float:
    """The sum over ``steps`` decode steps of ``windowed_read``, step ``j`` reading ``tokens + j * batch``:
    full layers grow by ``batch`` a step, a sliding layer's read stops growing once the mean context reaches its
    window (closed form: the simulator prices jumps of thousands of steps as one)."""
    full = steps * tokens + batch * steps * (steps - 1) / 2
    if not shares or batch <= 0:
        return full
    mean = tokens / batch
    total = full
    for s in shares:
        # Steps j whose mean context c + j is below the window read c + j; the rest read the window.
        below = min(steps, max(0, math.ceil(s.window - mean)))
        capped = below * mean + below * (below - 1) / 2 + (steps - below) * s.window
        total -= s.fraction * batch * (steps * mean + steps * (steps - 1) / 2 - capped)
    return total


# A step's prompt spans: (start, end) positions computed of each prompt (chunked prefill: the chunk's).
Spans = tuple[tuple[int, int], ...]


def _causal_pairs(start: int, end: int, window: float = math.inf) -> float:
    """Sum over positions p in [start, end) of min(p + 1, window): the keys each query attends to."""
    if end <= start:
        return 0.0
    below = min(end, window) if start < window else start  # positions under the window attend to p + 1 keys
    return (below * (below + 1) - start * (start + 1)) / 2 + (end - below) * min(window, end)


def prefill_pairs(shares: tuple[WindowShare, ...], spans: Spans) -> float:
    """(query, key) pairs a step's prompt spans attend to, as a share of every caching layer: full layers'
    causal pairs, a sliding layer's capped at its window (``shares``: the layers' fractions)."""
    full = sum(_causal_pairs(a, b) for a, b in spans)
    pairs = full
    for s in shares:
        pairs -= s.fraction * (full - sum(_causal_pairs(a, b, s.window) for a, b in spans))
    return pairs


@dataclass(frozen=True)
class Experts:
    """A mixture's routed experts, as the clock needs them (all zero for a dense model)."""

    layers: int = 0  # layers with routed experts
    count: int = 0  # E: experts a layer
    per_token: int = 0  # k: experts each token is routed to
    expert_bytes: int = 0  # one expert's weights in one layer, as stored
    expert_params: int = 0  # one expert's parameters in one layer
    width: int = 0  # N: an expert's intermediate size (moe_intermediate_size), the depth of its down projection

    def distinct(self, tokens: int) -> float:
        """Expected distinct experts a layer's ``tokens`` tokens route to (uniform routing)."""
        if not self.count or tokens <= 0:
            return 0.0
        return self.count * (1.0 - (1.0 - self.per_token / self.count) ** tokens)

    def unread_bytes(self, tokens: int) -> float:
        """Expert bytes a forward of ``tokens`` tokens does not read: the experts no token chose."""
        return self.layers * (self.count - self.distinct(tokens)) * self.expert_bytes

    def flops(self, tokens: int) -> float:
        """The routed experts' matmul FLOPs for ``tokens`` tokens: k experts a token, 2 FLOPs a parameter."""
        return 2.0 * self.layers * self.per_token * self.expert_params * tokens

    @property
    def inactive_params(self) -> int:
        """Parameters a token does not multiply by: the experts it is not routed to."""
        return self.layers * (self.count - self.per_token) * self.expert_params
