"""A quantized KV cache's accuracy, measured against the same requests at full precision.

A decode run at ``kv_dtype=fp8_e4m3`` (or another quantized store) is compared with the same
impl, model and requests at ``kv_dtype=auto``, the model's own dtype:

- ``kv_greedy_agreement``: the timed run's greedy tokens against the full-precision run's, up to each
  request's first divergence (harness/measure/agreement.py);
- ``kv_top1_agreement`` and ``kv_kl_mean``: the quantized run teacher-forced on the full-precision run's
  tokens, position by position (harness/serving/forced.py, harness/measure/accuracy.py);
- ``kv_perplexity`` and ``kv_ref_perplexity``: with ``workload=text``, both runs are fed the text itself,
  so these are the model's perplexity on it at each KV data type;
- ``kv_accuracy_gate``: ``pass`` when the top-1 agreement is at least ``TOP1_GATE`` (99%), MLPerf's way
  of holding a faster variant to a share of the full-precision run.

What the figures mean depends on the weights: on ``model.weights=dummy`` (seeded random) a model
has no preferences worth keeping, so its agreement says how far rounding moves logits, not how
much a trained model loses. ``kv_accuracy_weights`` says which, and the row's notes say it too.

Each cache is sized to hold every request at once (and a contiguous cache's lanes for a full batch),
so neither run preempts; rows are matched by request and position either way.
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch

from kvbench.harness.config import Config, ImplConfig
from kvbench.harness.kv.factory import build_cache
from kvbench.harness.kv.sizes import kv_bytes_per_token
from kvbench.harness.measure.accuracy import TOP1_GATE, gate
from kvbench.harness.measure.agreement import prefix_agreement
from kvbench.harness.serving.engine import Engine
from kvbench.harness.serving.forced import compare
from kvbench.harness.serving.workload import Request

DUMMY_NOTE = ("accuracy on dummy (random) weights: it says how far the KV data type moves the logits, "
              "not what a trained model loses")


def unchecked_note(kv_dtype: str, why: str) -> str:
    """The note of a row at a quantized ``kv_dtype`` whose accuracy was not measured (``why``: what turned
    it off). Its speed is that of a store whose error nobody looked at: a faster row that may be a worse
    model must say so, or it reads as a free win."""
    return f"kv_dtype={kv_dtype}: the quantized KV cache's accuracy was not checked ({why})"


def reference_config(cfg: Config) -> Config:
    """The same job with the model's own dtype in the cache."""
    ref = copy.deepcopy(cfg)
    ref.kv_dtype, ref.kv_scale = "auto", "tensor"
    return ref


def cache_bytes(cfg: Config, requests: list[Request]) -> int:
    """A budget that holds every request at once at ``cfg``'s KV data type (and a full batch of lanes)."""
    bs = cfg.block_size
    tokens = max(sum((-(-r.total_len // bs) + 1) * bs for r in requests), cfg.batch * cfg.max_seq_len)
    return int(1.1 * tokens * kv_bytes_per_token(cfg.model, cfg.dtype, cfg.kv_dtype, cfg.kv_scale))


def _engine(model, cfg: Config, impl: ImplConfig, requests: list[Request], device, sync):
    budget = cache_bytes(cfg, requests)
    return lambda sampler: Engine(model, build_cache(impl, cfg, budget, device), cfg.batch,
                                  cfg.max_num_batched_tokens, sync=sync, sampler=sampler,
                                  chunked_prefill=cfg.chunked_prefill)


def measure_kv_accuracy(model: torch.nn.Module, cfg: Config, impl: ImplConfig, device: torch.device,
                        requests: list[Request], greedy: dict[int, Sequence[int]] | None,
                        forced: dict[int, Sequence[int]] | None = None,
                        sync: Callable[[], None] = lambda: None) -> dict:
    """The accuracy columns of a decode row at ``cfg.kv_dtype`` (``greedy``: its timed run's tokens per
    request; ``forced``: the text's continuations, with ``workload=text``)."""
    ref_cfg = reference_config(cfg)
    tally, ref_tokens = compare(_engine(model, ref_cfg, impl, requests, device, sync),
                                _engine(model, cfg, impl, requests, device, sync), requests, cfg.model.vocab_size,
                                forced=forced)
    top1 = tally.top1_agreement
    row = {
        "kv_top1_agreement": top1,
        "kv_kl_mean": tally.kl_mean,
        "kv_accuracy_positions": tally.positions,
        "kv_accuracy_gate": gate(top1),
        "kv_accuracy_rule": f"teacher-forced top-1 agreement >= {TOP1_GATE:.0%} of kv_dtype=auto",
        "kv_accuracy_weights": "dummy" if cfg.model.weights == "dummy" else "checkpoint",
    }
    if forced is not None:  # a real text: the likelihood of its own tokens at each KV data type
        row["kv_perplexity"], row["kv_ref_perplexity"] = tally.perplexity, tally.ref_perplexity
    elif greedy is not None:
        row["kv_greedy_agreement"] = prefix_agreement({(r, 0): list(t) for r, t in ref_tokens.items()},
                                                      {(r, 0): list(t) for r, t in greedy.items()})
    return row


def measure_perplexity(model: torch.nn.Module, cfg: Config, impl: ImplConfig, device: torch.device,
                       requests: list[Request], forced: dict[int, Sequence[int]],
                       sync: Callable[[], None] = lambda: None) -> dict:
    """``workload=text`` at ``kv_dtype=auto``: the model's perplexity on the text (nothing to compare with)."""
    from kvbench.harness.serving.forced import Recording, check_reference_size
    from kvbench.harness.measure.accuracy import AccuracyTally

    check_reference_size(requests, cfg.model.vocab_size)
    recording = Recording(forced)
    _engine(model, cfg, impl, requests, device, sync)(recording).run(requests)
    tally = AccuracyTally()
    for (rid, pos), logp in recording.rows.items():
        tally.add(logp.view(1, -1), logp.view(1, -1), torch.tensor([int(forced[rid][pos])]))
    return {"kv_perplexity": tally.perplexity, "kv_accuracy_positions": tally.positions,
            "kv_accuracy_weights": "dummy" if cfg.model.weights == "dummy" else "checkpoint"}
