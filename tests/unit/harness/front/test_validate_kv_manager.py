"""kv_manager and swa_full_tokens_ratio are validated at the entry point with the allowed values; the default
(hybrid) keeps every existing job's identity; a manager another run cannot honour is refused naming it."""

from __future__ import annotations

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.resolve import resolve
from kvbench.harness.job.identity import job_id

SLIDING = ["model.layer_types=[sliding_attention,full_attention,sliding_attention,full_attention]",
           "model.sliding_window=128"]


@pytest.mark.parametrize(("override", "message"), [
    ("kv_manager=paged", "kv_manager='paged' is not allowed; allowed: uniform, hybrid, split_pools"),
    ("swa_full_tokens_ratio=0", "swa_full_tokens_ratio=0.0 must be a finite number > 0"),
    ("swa_full_tokens_ratio=-1.5", "swa_full_tokens_ratio=-1.5 must be a finite number > 0"),
])
def test_bad_value_names_the_allowed_ones(compose, override, message):
    with pytest.raises(ConfigError, match=message):
        resolve(compose(["model=tiny-llama", override]))


def test_an_unknown_layer_type_names_the_layer(compose):
    with pytest.raises(ConfigError, match="layer 1: attention kind 'mamba' is not supported; supported: "
                                          "full_attention, sliding_attention"):
        resolve(compose(["model=tiny-llama", "model.layer_types=[full_attention,mamba,full_attention,"
                                             "full_attention]"]))


def test_the_default_keeps_identity_and_another_manager_is_another_job(compose):
    base = resolve(compose(["model=tiny-llama", "+impl=paged_torch"]))
    explicit = resolve(compose(["model=tiny-llama", "+impl=paged_torch", "kv_manager=hybrid"]))
    uniform = resolve(compose(["model=tiny-llama", "+impl=paged_torch", "kv_manager=uniform"]))
    assert job_id(base, "cpu") == job_id(explicit, "cpu") != job_id(uniform, "cpu")


def test_the_searches_run_a_grouped_cache(compose, tmp_path):
    """max_concurrency and max_rate probe a grouped pool (its usage in layer slots) as capacity does: under hybrid a
    window-sized sliding group lets more 900-token requests share the pool than under uniform."""
    from kvbench.harness.front.job import run_job

    found = {}
    for manager in ("uniform", "hybrid"):
        (row,), code = run_job(compose(["model=tiny-gemma3", "+impl=paged_torch", "impl.prefix_caching=false",
                                        "scenario=max_concurrency", "scenario.probe=capacity", "max_seq_len=1024",
                                        "workload=fixed", "workload.prompt_len=800", "workload.output_len=100",
                                        "device.kv_cache_gb=0.02", f"kv_manager={manager}"]), tmp_path / manager)
        assert code == 0, row.get("error")
        found[manager] = row["max_concurrency"]
    assert found["hybrid"] > found["uniform"] > 0
    (row,), code = run_job(compose(["model=gemma-3-27b", "+impl=paged_torch", "impl.prefix_caching=false",
                                    "scenario=max_rate", "scenario.probe=capacity", "gpu=h100-sxm", "dtype=bfloat16",
                                    "max_seq_len=4096", "workload.num_requests=60", "slo=interactive", "arrival=poisson",
                                    "scenario.search_limit=8", "kv_manager=hybrid"]), tmp_path / "rate")
    assert code == 0, row.get("error")
    assert row["kv_manager"] == "hybrid" and row["max_rate_rps"] > 0


def test_split_pools_decodes_parallel_samples(compose):
    """A fork's copy-on-write names its pool (impls/allocator.py SlotCopy.pool): split_pools' tensors place it."""
    window = [SLIDING[0], "model.sliding_window=1024", "max_seq_len=1024", "kv_manager=split_pools",
              "+impl=paged_torch", "impl.prefix_caching=false"]
    resolve(compose(["model=tiny-llama", *window, "workload.n=2"]))
    resolve(compose(["model=tiny-llama", *window, "workload.n=2", "scenario=capacity"]))
    resolve(compose(["model=tiny-llama", *window, "kv_manager=hybrid", "workload.n=2"]))
