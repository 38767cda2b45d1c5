"""scenario=decode with cuda_graph on: the compute piece's decode pieces run every decode step, and their memory
comes out of the KV budget. On CPU the pieces run eagerly (nothing is captured), so their memory is charged as
a fixed test figure."""

from __future__ import annotations

from kvbench.harness.front.job import run_job
from kvbench.harness.model.piecewise import PiecewiseDecode
from kvbench.harness.scenarios.compute import Compute

COMMON = ["+impl=paged_torch", "model=tiny-llama", "dtype=float32", "max_seq_len=128", "scenario.warmup=0",
          "device=cpu", "batch=4", "workload.num_requests=5", "workload.prompt_len=20", "workload.output_len=6"]


def test_decode_runs_the_pieces_and_charges_their_memory(compose, tmp_path, monkeypatch):
    def pieces(self):
        if "pieces" not in self.job.memo:
            self.job.memo["pieces"] = PiecewiseDecode(self.model, self.job.cfg.batch, capture=False)
            self.job.memo["pieces"].pool_bytes = 1_000_000
        return self.job.memo["pieces"]

    (plain,), code = run_job(compose(COMMON), tmp_path / "plain")
    assert code == 0, plain.get("error")
    monkeypatch.setattr(Compute, "decode_pieces", property(pieces))
    (row,), code = run_job(compose(COMMON), tmp_path / "pieces")
    assert code == 0, row.get("error")
    assert row["output_digest"] == plain["output_digest"]
    assert row["piecewise_steps"] == row["decode_steps"] > 0 and plain["piecewise_steps"] == 0
    assert row["budget_graph_bytes"] == 1_000_000 and plain["budget_graph_bytes"] == 0
    assert row["budget_kv_bytes"] == plain["budget_kv_bytes"] - 1_000_000
