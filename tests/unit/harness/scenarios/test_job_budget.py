"""The KV budget piece: measured once per job, in the memo an isolated impl's process gets."""

from __future__ import annotations

from kvbench.harness.front.resolve import resolve
from kvbench.harness.scenarios import job_budget
from kvbench.harness.scenarios.context import JobContext

SMALL = ["+impl=contiguous", "model=tiny-llama", "dtype=float32", "device=cpu", "max_seq_len=64", "batch=2",
         "workload=fixed", "workload.num_requests=3", "workload.prompt_len=8", "workload.output_len=5"]


def test_measured_once_and_handed_on_with_the_memo(compose, tmp_path, monkeypatch):
    real, calls = job_budget.measured_kv_budget, []

    def counted(cfg, device, prompt_lens, build_model, build_pieces):
        calls.append(prompt_lens)
        return real(cfg, device, prompt_lens, build_model, build_pieces)

    monkeypatch.setattr(job_budget, "measured_kv_budget", counted)
    cfg = resolve(compose(SMALL))
    ctx = JobContext(cfg, tmp_path, None)
    first = ctx.budget.measured()
    assert ctx.budget.measured() is first and calls == [[8, 8, 8]]
    assert ctx.job.memo["budget"] is first
    child = JobContext(cfg, tmp_path, None, memo=ctx.job.memo)  # an isolated impl's process
    assert child.budget.measured() is first and len(calls) == 1
