"""The time a cache spends attending, per forward: attention apart from the dense work of a step.

A step's time is the model's dense work (projections, MLP, norms, logits) plus each layer's
attention through the cache (its K/V write and its kernel). The profile scenario wants the two
apart, since attention grows with batch x context and the dense work with batch alone, and a
reader asks what share of a step the cache's kernel really is.

``AttentionTimer.wrap(cache)`` replaces the cache's ``forward_prefill`` and ``forward_decode`` on
that one instance (the engine looks them up at each call) by timed calls of the originals, so the
engine, the model and the kernels run exactly as in any run. Each forward of the model calls them
once per layer, starting at layer 0, so the calls group into forwards by that: ``per_forward()``
gives one figure per forward, in the order the engine made them.

- On CPU a call is timed with ``time.perf_counter`` (the call returns when its work is done).
- On CUDA it sits between two CUDA events, read after one synchronisation when asked, so the
  figure is the GPU's time in attention, with no sync inside the step.

The cost of timing itself is two clock reads per layer (well under a microsecond on CPU), inside
the step's own time, as small as the platform allows.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

FORWARDS = ("forward_prefill", "forward_decode")


class AttentionTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._forwards: list[list[Any]] = []  # per forward: one handle per layer call

    def wrap(self, cache: Any) -> Any:
        """Time ``cache``'s attention from now on; returns the cache."""
        for name in FORWARDS:
            setattr(cache, name, self._timed(getattr(cache, name)))
        return cache

    def _timed(self, attend: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        forwards = self._forwards

        def timed(layer: int, *args: Any) -> torch.Tensor:
            if layer == 0 or not forwards:
                forwards.append([])
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = attend(layer, *args)
                end.record()
                forwards[-1].append((start, end))
                return out
            t0 = time.perf_counter()
            out = attend(layer, *args)
            forwards[-1].append(time.perf_counter() - t0)
            return out

        return timed

    def per_forward(self) -> list[float]:
        """Seconds in attention of each forward so far, in order."""
        if self.cuda:
            torch.cuda.synchronize()
            return [sum(s.elapsed_time(e) for s, e in calls) / 1e3 for calls in self._forwards]
        return [sum(calls) for calls in self._forwards]
