"""resolve: the reuse workloads' keys (workload.kind, format and their keys) fail naming the key."""

from __future__ import annotations

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.resolve import resolve

BASE = ["model=tiny-llama", "device=cpu"]


def test_multi_turn_takes_users_x_turns_requests(compose):
    cfg = resolve(compose([*BASE, "workload=multi_turn", "workload.users=3", "workload.turns=5"]))
    assert cfg.workload.num_requests == 15 and cfg.workload.kind == "multi_turn"
    cfg = resolve(compose([*BASE, "workload=system_prompt", "batch=7"]))
    assert cfg.workload.num_requests == 7 and cfg.workload.zipf_exponent == 1.0


@pytest.mark.parametrize("overrides, expected", [
    (["workload.kind=chatty"], "workload.kind='chatty' is not allowed; allowed: plain, multi_turn, system_prompt"),
    (["workload.format=sharegpt"], "workload.format='sharegpt' is not allowed; allowed: plain, mooncake"),
    (["workload=multi_turn", "workload.think_distribution=gamma"], "workload.think_distribution='gamma'"),
    (["workload=multi_turn", "workload.users=0"], "workload.users=0 must be >= 1"),
    (["workload=multi_turn", "workload.think_time_s=-1"], "workload.think_time_s=-1.0 must be >= 0"),
    (["workload=multi_turn", "workload.num_requests=5"], "must equal workload.users x workload.turns = 32"),
    (["workload=multi_turn", "workload.n=2"], "workload.n=2: workload.kind=multi_turn has one answer"),
    (["workload=multi_turn", "scenario=max_rate"], "runs in scenario=decode|capacity, not scenario=max_rate"),
    (["workload=multi_turn", "workload.shared_prefix_len=4"], "workload.shared_prefix_len=4 is for workload.kind=plain"),
    (["workload=system_prompt", "workload.zipf_exponent=-1"], "workload.zipf_exponent=-1.0 must be >= 0"),
    (["workload=system_prompt", "workload.system_prompt_len=2000", "max_seq_len=512"],
     "workload.system_prompt_len=2000 must be in [1, max_seq_len - 2 = 510]"),
    (["workload=system_prompt", "workload.system_prompts=0"], "workload.system_prompts=0 must be >= 1"),
    (["chunked_prefill=true", "batch=64", "max_num_batched_tokens=32"],
     "chunked_prefill=true: max_num_batched_tokens=32 must be >= batch=64"),
    (["workload.format=mooncake"], "workload.format=mooncake is a trace file's format"),
    (["workload=mooncake", "workload.path=x.jsonl", "workload.shared_prefix_len=3"],
     "workload.shared_prefix_len=3: workload.format=mooncake takes every prompt token"),
    (["workload=mooncake", "workload.path=x.jsonl", "workload.hash_block_size=0"],
     "workload.hash_block_size=0 must be >= 1"),
])
def test_bad_reuse_keys_are_config_errors_naming_the_key(compose, overrides, expected):
    with pytest.raises(ConfigError) as err:
        resolve(compose([*BASE, *overrides]))
    assert expected in str(err.value)
