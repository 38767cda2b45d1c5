"""The engine's KV sizing rule (engine.kv_fraction_of, harness/kv/budget.py): vLLM's share of the whole card
against TensorRT-LLM's share of what the weights and activations leave."""

from __future__ import annotations

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.resolve import resolve
from kvbench.harness.kv.budget import kv_budget, kv_fraction_of

TP2_70B = ["scenario=capacity", "model=llama-3.1-70b", "dtype=float16", "gpu=a100-80gb", "gpu.count=2",
           "workload=fixed", "workload.prompt_len=128", "workload.output_len=128", "max_seq_len=256", "+impl=paged"]


def test_each_engine_sizes_the_kv_cache_by_its_own_rule(compose):
    vllm = kv_budget(resolve(compose([*TP2_70B, "engine=vllm_v1"])))
    trt = kv_budget(resolve(compose([*TP2_70B, "engine=trtllm"])))
    assert vllm.device_bytes == trt.device_bytes == 2 * 81920 * 2**20  # two 80 GiB cards
    assert vllm.weight_bytes == trt.weight_bytes
    rest = vllm.weight_bytes + vllm.activation_bytes
    assert vllm.kv_bytes == int(vllm.device_bytes * 0.9) - rest
    rest = trt.weight_bytes + trt.activation_bytes
    assert trt.kv_bytes == int((trt.device_bytes - rest) * 0.9)
    assert trt.usable_bytes == rest + trt.kv_bytes  # what the engine takes in all
    # 141 GB of weights on 172 GB: a tenth of the card is most of what is left (the engine file's "about 2.4x")
    assert 2.2 < trt.kv_bytes / vllm.kv_bytes < 2.6


def test_the_rule_is_a_key_of_the_engine_and_a_cpu_run_has_vllms(compose):
    assert kv_fraction_of(resolve(compose([*TP2_70B, "engine=vllm_v1", "engine.kv_fraction_of=free"]))) == "free"
    assert kv_fraction_of(resolve(compose([*TP2_70B, "engine=trtllm", "engine.kv_fraction_of=total"]))) == "total"
    assert kv_fraction_of(resolve(compose(["scenario=capacity", "+impl=paged"]))) == "total"  # no gpu: no engine


def test_an_unknown_rule_is_named_with_the_allowed_ones(compose):
    with pytest.raises(ConfigError, match=r"engine.kv_fraction_of.*'share'.*total.*free"):
        resolve(compose([*TP2_70B, "engine=trtllm", "engine.kv_fraction_of=share"]))


def test_a_card_the_rest_fills_says_which_rule_left_nothing(compose):
    cfg = resolve(compose([*TP2_70B, "engine=trtllm", "device.memory_gb=142"]))
    with pytest.raises(ConfigError, match=r"device.memory_gb=142.00 GB \(engine.kv_fraction_of=free: .*\) leaves "
                                          r"nothing for the KV cache: weights need 141.\d\d GB"):
        kv_budget(cfg)
