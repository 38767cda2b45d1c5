"""AttentionTimer: a cache's attention time per forward, apart from the rest of the step."""

from __future__ import annotations

import time

import torch

from kvbench.harness.measure.attention_timer import AttentionTimer


class SlowCache:
    """Attends by sleeping a known time per layer, so the timer's sums can be checked."""

    def __init__(self, prefill_s: float, decode_s: float) -> None:
        self.prefill_s, self.decode_s = prefill_s, decode_s
        self.calls: list[tuple[str, int]] = []

    def forward_prefill(self, layer, q, k, v, meta):
        self.calls.append(("prefill", layer))
        time.sleep(self.prefill_s)
        return q + 1

    def forward_decode(self, layer, q, k, v, meta):
        self.calls.append(("decode", layer))
        time.sleep(self.decode_s)
        return q * 2


def _forward(attend, layers: int, x: torch.Tensor, dense_s: float) -> torch.Tensor:
    """A model's forward: dense work around each layer's attention."""
    for layer in range(layers):
        time.sleep(dense_s)
        x = attend(layer, x, None, None, "meta")
    return x


def test_each_forward_sums_its_layers_attention_and_leaves_the_dense_work_out():
    timer = AttentionTimer(torch.device("cpu"))
    cache = timer.wrap(SlowCache(prefill_s=0.004, decode_s=0.001))
    x = torch.ones(2)
    out = _forward(cache.forward_prefill, 3, x, dense_s=0.01)
    assert torch.equal(out, x + 3)  # the cache's own results, unchanged
    for _ in range(2):
        out = _forward(cache.forward_decode, 3, out, dense_s=0.01)
    per = timer.per_forward()
    assert len(per) == 3
    assert 3 * 0.004 <= per[0] < 3 * 0.004 + 0.02  # three prefill layers, none of the 30 ms of dense work
    assert all(3 * 0.001 <= p < 3 * 0.001 + 0.02 for p in per[1:])
    assert cache.calls == [("prefill", i) for i in range(3)] + [("decode", i) for i in range(3)] * 2


def test_a_model_with_one_layer_makes_one_forward_per_call():
    timer = AttentionTimer(torch.device("cpu"))
    cache = timer.wrap(SlowCache(0.0, 0.0))
    for _ in range(4):
        _forward(cache.forward_decode, 1, torch.zeros(1), dense_s=0.0)
    assert len(timer.per_forward()) == 4
