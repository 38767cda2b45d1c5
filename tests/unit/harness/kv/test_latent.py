"""What an MLA layer and a linear-attention layer keep, as exact byte counts: the issue's figures for DeepSeek-V3
and Qwen3-Next-80B, kvbench's kv_bytes_per_token and state_bytes_per_seq, and how tensor parallelism splits them."""

from __future__ import annotations

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.kv import latent
from kvbench.harness.kv.sizes import kv_bytes_per_token, state_bytes_per_seq
from kvbench.harness.model.hf_config import resolve_model_config
from tests.helpers.models import load_named


def named(name: str):
    return resolve_model_config(load_named(name))


def test_deepseek_v3_caches_61_latents_of_576_values() -> None:
    """70,272 bytes a token in bf16 (68.6 KiB); every value in one byte at fp8 (per-tensor scales, not per token),
    one fp32 scale per token and layer more at kv_scale=token_head; FlashMLA's layout 656 bytes a layer."""
    v3 = named("deepseek-v3")
    assert latent.values_per_token(v3) == 512 + 64
    assert kv_bytes_per_token(v3, "bfloat16") == 61 * 576 * 2 == 70_272
    assert kv_bytes_per_token(v3, "bfloat16", "fp8_e4m3") == 61 * 576 == 35_136
    assert kv_bytes_per_token(v3, "bfloat16", "fp8_e4m3", "token_head") == 61 * (576 + 4)
    assert latent.flashmla_fp8_bytes_per_layer(v3) == 512 + 4 * 4 + 64 * 2 == 656
    assert state_bytes_per_seq(v3, "bfloat16") == 0


def test_the_same_model_cached_as_ordinary_attention() -> None:
    """128 heads of K (128 + 64) and V (128) per layer: about 4.7 MB a token, 71x the latent."""
    v3 = named("deepseek-v3")
    mha = 61 * latent.mha_values_per_token(v3) * 2
    assert mha == 61 * 128 * (192 + 128) * 2 == 4_997_120
    assert mha / kv_bytes_per_token(v3, "bfloat16") == pytest.approx(71.1, abs=0.05)
    kimi = named("kimi-k2")  # half the heads: half the comparison figure, the same latent
    assert kv_bytes_per_token(kimi, "bfloat16") == 70_272 and latent.mha_values_per_token(kimi) == 64 * 320


def test_v2_lite_caches_27_latents() -> None:
    assert kv_bytes_per_token(named("deepseek-v2-lite"), "bfloat16") == 27 * 576 * 2


def test_qwen3_next_keeps_k_v_in_12_layers_and_a_state_in_36() -> None:
    """Per token: 12 full layers x 2 kv heads x 256 x K and V. Per sequence: 36 layers of a 32 x 128 x 128
    recurrent state and a 3 x 8192 convolution state, 39.5 MB in bf16 at any length."""
    m = named("qwen3-next-80b-a3b")
    assert latent.cached_layers(m) == 12 and latent.linear_layers(m) == 36
    assert kv_bytes_per_token(m, "bfloat16") == 12 * 2 * 2 * 256 * 2 == 24_576
    assert latent.conv_channels(m) == 2 * 16 * 128 + 32 * 128 == 8192
    assert latent.state_values_per_layer(m) == 32 * 128 * 128 + 3 * 8192
    assert state_bytes_per_seq(m, "bfloat16") == 36 * 548_864 * 2 == 39_518_208
    assert state_bytes_per_seq(m, "float32") == 2 * 39_518_208
    one_32k = 32_768 * kv_bytes_per_token(m, "bfloat16") + state_bytes_per_seq(m, "bfloat16")
    assert one_32k == 844_824_576  # 0.84 GB: 4.7% of it state
    assert latent.state_tokens(m) == -(-548_864 // 1024) == 536  # slots of one full layer's K/V per token


def test_a_quantized_store_is_refused_beside_a_recurrent_state() -> None:
    with pytest.raises(ConfigError, match="kv_dtype=fp8_e4m3.*linear_attention.*allowed: kv_dtype=auto"):
        kv_bytes_per_token(named("qwen3-next-80b-a3b"), "bfloat16", "fp8_e4m3")


def test_tensor_parallel_notes_say_what_is_replicated() -> None:
    v3, nxt, llama = named("deepseek-v3"), named("qwen3-next-80b-a3b"), named("llama-3.1-8b")
    assert latent.tp_note(v3, 1) is None and latent.tp_note(llama, 8) is None
    assert "replicates the latent on every rank" in latent.tp_note(v3, 8) and "DP=8" in latent.tp_note(v3, 8)
    assert "each held by 4 ranks" in latent.tp_note(nxt, 8)
    assert "each held by" not in latent.tp_note(nxt, 2)
