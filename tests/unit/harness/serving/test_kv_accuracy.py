"""A quantized KV cache's accuracy against kv_dtype=auto: on an HF checkpoint written here, on its own text."""

from __future__ import annotations

import pytest

from kvbench.harness.front.job import run_job
from tests.helpers.models import write_hf_checkpoint, write_text

TINY = ["device=cpu", "dtype=float32", "max_seq_len=96", "batch=4", "scenario.warmup=0", "cpu_threads=1"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    write_hf_checkpoint(folder)
    write_text(folder / "text.txt", 600)
    return folder


def _row(compose, tmp_path, overrides):
    rows, code = run_job(compose(["progress=false", *TINY, *overrides]), tmp_path)
    assert code == 0, [r.get("error") for r in rows]
    (row,) = rows
    assert row["status"] == "ok", row.get("error")
    return row


def _text(checkpoint) -> list[str]:
    return [f"model.path={checkpoint}", "model.weights=path", "workload=text", f"workload.path={checkpoint / 'text.txt'}",
            "workload.prompt_len=24", "workload.output_len=16", "workload.num_requests=6"]


@pytest.mark.parametrize("impl", ["paged_torch", "contiguous"])
def test_each_kv_dtype_against_auto_on_the_checkpoints_text(compose, tmp_path, checkpoint, impl):
    auto = _row(compose, tmp_path / "auto", [f"+impl={impl}", *_text(checkpoint)])
    assert auto["kv_perplexity"] > 1 and auto["kv_accuracy_positions"] == 6 * 16
    assert auto["kv_accuracy_weights"] == "checkpoint" and "dummy" not in (auto["notes"] or "")
    kl = {}
    for kv in ("int8", "fp8_e4m3", "fp8_e5m2"):
        row = _row(compose, tmp_path / kv, [f"+impl={impl}", f"kv_dtype={kv}", *_text(checkpoint)])
        # the reference run is kv_dtype=auto on the same text: the same perplexity as the auto job's own
        assert row["kv_ref_perplexity"] == pytest.approx(auto["kv_perplexity"], rel=1e-5)
        assert row["kv_accuracy_positions"] == 6 * 16 and row["kv_accuracy_gate"] in ("pass", "fail")
        assert (row["kv_accuracy_gate"] == "pass") == (row["kv_top1_agreement"] >= 0.99)
        kl[kv] = row["kv_kl_mean"]
        assert "kv_greedy_agreement" not in row or row["kv_greedy_agreement"] is None  # forced on the text
    # the coarser the store, the further the distributions move: int8 (0.4% of the range) < e4m3 < e5m2
    assert 0 < kl["int8"] < kl["fp8_e4m3"] < kl["fp8_e5m2"]


def test_dummy_weights_say_so_and_greedy_agreement_is_measured(compose, tmp_path):
    row = _row(compose, tmp_path, ["+impl=paged_torch", "model=tiny-llama", "kv_dtype=fp8_e5m2", "workload=fixed",
                                   "workload.num_requests=4", "workload.prompt_len=20", "workload.output_len=10"])
    assert row["kv_accuracy_weights"] == "dummy" and "dummy (random) weights" in row["notes"]
    assert 0 <= row["kv_greedy_agreement"] <= 1 and 0 <= row["kv_top1_agreement"] <= 1
    assert row["kv_accuracy_positions"] == 40 and row.get("kv_perplexity") is None


def test_no_accuracy_at_auto_without_a_text_or_when_turned_off(compose, tmp_path):
    plain = ["+impl=paged_torch", "model=tiny-llama", "workload=uniform", "workload.num_requests=2",
             "workload.prompt_len=8", "workload.output_len=3"]
    assert _row(compose, tmp_path / "a", plain).get("kv_top1_agreement") is None
    off = _row(compose, tmp_path / "b", [*plain, "kv_dtype=int8", "scenario.accuracy=false"])
    assert off.get("kv_top1_agreement") is None


def test_text_needs_a_checkpoint_and_a_file(compose, tmp_path):
    from kvbench.harness.errors import ConfigError
    from kvbench.harness.front.resolve import resolve

    with pytest.raises(ConfigError, match="set model.path=DIR"):
        resolve(compose(["+impl=paged_torch", "device=cpu", "workload=text", "workload.path=/tmp/x.txt"]))
    with pytest.raises(ConfigError, match="workload.path must name a local text file"):
        resolve(compose(["+impl=paged_torch", "device=cpu", "workload=text", "model.path=/tmp"]))
