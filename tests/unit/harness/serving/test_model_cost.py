"""What the clock needs of a model, for the caches that are not K and V (roofline version 7): MLA's absorbed decode
attention priced by its FLOPs where they outweigh its read, and a linear-attention state read and rewritten by
every step of every sequence. Worked by hand from the named configs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvbench.harness.serving.cost_model import CostModel, gpu_spec
from kvbench.harness.serving.model_cost import attention_flops_per_token, model_cost, prefill_attention_flops_per_pair
from tests.helpers.models import load_named


def _clock(compose, model: str, gpu: str, kv_dtype: str = "auto") -> CostModel:
    """One ``gpu``'s clock (its conf file, resolved) for the named config ``model`` in bf16."""
    from kvbench.harness.front.resolve import resolve

    card = resolve(compose(["scenario=capacity", "model=tiny-llama", f"gpu={gpu}"])).gpu
    return CostModel(gpu_spec(card), model_cost(load_named(model), "bfloat16", kv_dtype))


def test_attention_flops_a_kv_token_read():
    # DeepSeek-V3: 61 layers x 2 x 128 heads x ((512 + 64) for q.k + 512 for p.v), against 576 values read
    assert attention_flops_per_token(load_named("deepseek-v3")) == 61 * 2 * 128 * (576 + 512) == 16_990_208
    # Llama-3.1-70B: 80 layers x 2 x 64 heads x (128 + 128), against 8 kv heads' K and V
    assert attention_flops_per_token(load_named("llama-3.1-70b")) == 80 * 2 * 64 * 256
    # Qwen3-Next: its 12 full-attention layers only (16 heads of 256); the 36 linear ones keep no token
    assert attention_flops_per_token(load_named("qwen3-next-80b-a3b")) == 12 * 2 * 16 * 512


def test_mla_is_compute_bound_where_gqa_is_memory_bound(compose):
    """FLOPs a byte: DeepSeek-V3's 242 in bf16 and 484 in fp8, Llama-3.1-70B's 8; the clock's ridge (F*ef over
    A*ea): 234 on an H200 (its measured copy rate), 369 on an H100 SXM (0.8 of the datasheet)."""
    for gpu, ridge in (("h200", 989e12 * 0.6 / (4228e9 * 0.6)), ("h100-sxm", 989e12 * 0.6 / (3350e9 * 0.8 * 0.6))):
        llama = _clock(compose, "llama-3.1-70b", gpu)
        assert llama.model.attn_flops_per_token / llama.model.kv_bytes_per_token == 8
        assert llama._attn_s_per_token == pytest.approx(llama.model.kv_bytes_per_token / llama.attn_bytes_per_s)
        for kv_dtype, intensity in (("auto", 16_990_208 / 70_272), ("fp8_e4m3", 16_990_208 / 35_136)):
            ds = _clock(compose, "deepseek-v3", gpu, kv_dtype)
            assert ds.model.attn_flops_per_token / ds.model.kv_bytes_per_token == pytest.approx(intensity)
            flops_s = ds.model.attn_flops_per_token / ds.attn_flops_per_s
            bytes_s = ds.model.kv_bytes_per_token / ds.attn_bytes_per_s
            assert ds._attn_s_per_token == pytest.approx(max(flops_s, bytes_s))
            assert (flops_s > bytes_s) == (intensity > ridge)
    assert 16_990_208 / 70_272 > 989e12 * 0.6 / (4228e9 * 0.6)  # bf16 on the H200: compute-bound
    assert 16_990_208 / 70_272 < 989e12 * 0.6 / (3350e9 * 0.8 * 0.6)  # on the H100: 65% of its ridge


def test_a_linear_state_is_read_and_rewritten_every_step_by_every_sequence(compose):
    clock = _clock(compose, "qwen3-next-80b-a3b", "h200")
    sb = clock.model.state_bytes_per_seq
    assert sb == 39_518_208  # 36 layers x (32 x 128 x 128 recurrent + 3 x 8192 conv) x 2 bytes
    stateless = CostModel(clock.gpu, replace(clock.model, state_bytes_per_seq=0))
    per_seq = 2 * sb / clock.bytes_per_s
    for batch in (1, 7, 64):
        assert clock.decode_s(batch, 4096 * batch) - stateless.decode_s(batch, 4096 * batch) == pytest.approx(
            batch * per_seq)
        assert clock.decode_s(batch, 4096 * batch, steps=5) - stateless.decode_s(batch, 4096 * batch, steps=5) == \
            pytest.approx(5 * batch * per_seq)
    assert clock.prefill_s(2048, 2) - stateless.prefill_s(2048, 2) == pytest.approx(2 * per_seq)
    assert clock.mixed_s(256, 8, 8 * 1000) - stateless.mixed_s(256, 8, 8 * 1000) == pytest.approx(9 * per_seq)


def test_a_model_of_kv_layers_keeps_its_version_6_price(compose):
    """Nothing moves for the models kvbench priced before: no state, and attention's read outweighs its FLOPs."""
    for model in ("llama-3.1-8b", "qwen3-32b", "gemma-3-27b", "gpt-oss-120b"):
        clock = _clock(compose, model, "h100-sxm")
        assert clock.model.state_bytes_per_seq == 0
        assert clock._attn_s_per_token == clock.model.kv_bytes_per_token / clock.attn_bytes_per_s


def test_prompt_attention_flops_a_pair_and_their_price(compose):
    """Roofline version 10: a prompt's attention, per (query, key) pair. MLA's prefill is the un-absorbed form."""
    # DeepSeek-V3: 61 layers x 2 x 128 heads x (192 for q.k + 128 for p.v); GQA's equals its decode figure
    assert prefill_attention_flops_per_pair(load_named("deepseek-v3")) == 61 * 2 * 128 * (192 + 128)
    assert prefill_attention_flops_per_pair(load_named("llama-3.1-70b")) == 80 * 2 * 64 * 256
    assert prefill_attention_flops_per_pair(load_named("qwen3-next-80b-a3b")) == 12 * 2 * 16 * 512
    clock = _clock(compose, "llama-3.1-8b", "h100-sxm")
    pairs = 2048 * 2049 / 2
    attention = pairs * 32 * 2 * 32 * 256 / clock.attn_flops_per_s
    assert clock.prefill_s(2048, spans=((0, 2048),)) - clock.prefill_s(2048) == pytest.approx(attention)
    # 4% of the 8B model's 2,048-token prefill FLOPs, and priced as such (module doc of cost_model.py)
    assert 0.03 < pairs * clock.model.prefill_flops_per_pair / clock.model.flops(2048, 1) < 0.05
    # A chunk attends to the chunks before it: the second half of the prompt pays three quarters of the pairs.
    second = clock.mixed_s(1024, 4, 4000, spans=((1024, 2048),)) - clock.mixed_s(1024, 4, 4000)
    assert second == pytest.approx(attention * (2048 * 2049 - 1024 * 1025) / (2048 * 2049))
