"""scenario=max_rate with cuda_graph on: every probe keeps the batch, so every probe replays the one set of
decode pieces the job built (Compute.shared_with), instead of capturing its own."""

from __future__ import annotations

from kvbench.harness.front.resolve import resolve
from kvbench.harness.model.piecewise import PiecewiseDecode
from kvbench.harness.scenarios import max_rate
from kvbench.harness.scenarios.context import JobContext


def test_max_rate_probes_replay_one_set_of_pieces(compose, tmp_path, monkeypatch):
    built, calls = [], []

    class Counted(PiecewiseDecode):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

        def __call__(self, *args, **kwargs):
            calls.append(self)
            return super().__call__(*args, **kwargs)

    monkeypatch.setattr("kvbench.harness.model.piecewise.PiecewiseDecode", Counted)
    cfg = resolve(compose(["+impl=paged_torch", "model=tiny-llama", "dtype=float32", "max_seq_len=128",
                           "device=cpu", "scenario=max_rate", "arrival=poisson", "slo.e2el_ms=100000", "batch=3",
                           "workload.num_requests=3", "workload.prompt_len=8", "workload.output_len=3",
                           "workload=fixed", "scenario.start_rps=64", "scenario.search_limit=256",
                           "scenario.tolerance_rps=64", "scenario.warmup=0"]))
    cfg.cuda_graph = True  # after resolve: on CPU the pieces run eagerly
    ctx = JobContext(cfg, tmp_path, None)
    (row,) = ctx.call(max_rate.run, cfg.impl)
    assert row["status"] == "ok" and row["probes"] >= 2
    assert len(built) == 1 and built[0].max_batch == 3
    assert calls and set(calls) == set(built)  # every probe's decode steps ran the one set
