"""harness/model/deepseek.py: MLA's absorbed formulation (what every cache attends with) equals the expanded one
(transformers': per-head K = [W_UK c ; k_pe], V = W_UV c, ordinary softmax attention) on random inputs of awkward
sizes; the rotary convention is transformers' interleaved one; the softmax scale folds yarn's mscale as
transformers does; a bad shape is one ConfigError."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from kvbench.harness.errors import ConfigError
from kvbench.harness.model.config import ModelConfig, RopeScaling, softmax_scale
from kvbench.harness.model.deepseek import DeepseekModel, LatentAttention, deinterleave, yarn_cos_sin_factor
from kvbench.harness.model.rope import RotaryEmbedding, apply_rotary

# Awkward on purpose: 3 heads, an odd latent, rotary, K-nope and V that all differ.
SHAPE = dict(architecture="deepseek_v3", hidden_size=40, num_heads=3, num_kv_heads=3, head_dim=6, kv_lora_rank=22,
             q_lora_rank=18, qk_nope_head_dim=10, qk_rope_head_dim=6, v_head_dim=14, num_experts=4,
             num_experts_per_tok=2, moe_intermediate_size=8, n_group=2, topk_group=1, num_layers=2,
             first_k_dense_replace=1, n_shared_experts=1, intermediate_size=24, vocab_size=32)


def _attention(q_lora: int | None, interleave: bool, seed: int) -> tuple[ModelConfig, LatentAttention]:
    cfg = ModelConfig(**{**SHAPE, "q_lora_rank": q_lora, "rope_interleave": interleave})
    attn = LatentAttention(cfg, torch.float64, "cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 1))
    return cfg, attn


def _causal(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over keys ``[..., T, T]`` with every query seeing itself and the keys before it."""
    t = scores.shape[-1]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)


def _expanded(attn: LatentAttention, cfg: ModelConfig, x: torch.Tensor, cos, sin, scale: float) -> torch.Tensor:
    """transformers' formulation: every head's K and V expanded from the latent, then plain attention."""
    t, heads = x.shape[0], cfg.num_heads
    q = attn.queries(x)
    q_nope, q_pe = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
    latent, k_pe = attn.kv_a_proj_with_mqa(x).split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
    kv = attn.kv_b_proj(attn.kv_a_layernorm(latent.contiguous())).view(t, heads, -1)
    k_nope, v = kv.split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
    k_rot = attn.rotate(k_pe[:, None, :], cos, sin).expand(t, heads, -1)
    keys = torch.cat((k_nope, k_rot), dim=-1)
    queries = torch.cat((q_nope, attn.rotate(q_pe, cos, sin)), dim=-1)
    probs = _causal(torch.einsum("qhd,khd->hqk", queries, keys) * scale)
    out = torch.einsum("hqk,khv->qhv", probs, v)
    return attn.o_proj(out.reshape(t, heads * cfg.v_head_dim))


@pytest.mark.parametrize("q_lora,interleave,tokens",
                         [(18, True, 7), (None, True, 1), (18, False, 13), (None, False, 5)])
def test_absorbed_attention_equals_the_expanded_one(q_lora, interleave, tokens):
    """The cache's view (one kv head of kv_lora_rank + qk_rope values, the key its own value) and the model's W_UV
    after it give transformers' expanded attention, at the positions of a long context."""
    cfg, attn = _attention(q_lora, interleave, seed=tokens)
    x = torch.randn(tokens, cfg.hidden_size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    cos, sin = RotaryEmbedding(cfg.qk_rope_head_dim, 10000.0, None, "cpu")(torch.arange(40, 40 + tokens),
                                                                            torch.float64)
    scale = softmax_scale(cfg)
    q_abs, k, v = attn.qkv(x, cos, sin)
    assert q_abs.shape == (tokens, 3, 28) and k.shape == (tokens, 1, 28) and v is k
    probs = _causal(torch.einsum("qhd,kd->hqk", q_abs, k[:, 0]) * scale)
    absorbed = attn.project_out(torch.einsum("hqk,kd->qhd", probs, k[:, 0]))
    torch.testing.assert_close(absorbed, _expanded(attn, cfg, x, cos, sin, scale), rtol=1e-10, atol=1e-10)


def test_a_wrong_absorption_is_caught():
    """The comparison can fail: W_UK taken from V's rows instead of K's gives another attention."""
    cfg, attn = _attention(18, True, seed=3)
    x = torch.randn(6, cfg.hidden_size, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    cos, sin = RotaryEmbedding(cfg.qk_rope_head_dim, 10000.0, None, "cpu")(torch.arange(6), torch.float64)
    want = _expanded(attn, cfg, x, cos, sin, softmax_scale(cfg))
    w_uk, w_uv = attn.up_projections()
    attn.up_projections = lambda: (w_uv[:, : cfg.qk_nope_head_dim], w_uv)  # type: ignore[method-assign]
    q_abs, k, _ = attn.qkv(x, cos, sin)
    probs = _causal(torch.einsum("qhd,kd->hqk", q_abs, k[:, 0]) * softmax_scale(cfg))
    assert not torch.allclose(attn.project_out(torch.einsum("hqk,kd->qhd", probs, k[:, 0])), want, atol=1e-3)


def test_the_rotary_part_is_transformers_interleaved_rotation():
    """V3's rope_interleave (and V2's complex pairs): rotating the de-interleaved halves is bit for bit transformers'
    ``apply_rotary_pos_emb_interleave`` (its output is in that layout too)."""
    hf = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    x = torch.randn(5, 3, 16, generator=torch.Generator().manual_seed(4))
    cos, sin = RotaryEmbedding(16, 10000.0, None, "cpu")(torch.arange(3, 8), torch.float32)
    want, _ = hf.apply_rotary_pos_emb_interleave(x.transpose(0, 1), x.transpose(0, 1), cos, sin, unsqueeze_dim=0)
    assert torch.equal(apply_rotary(deinterleave(x), cos, sin), want.transpose(0, 1))


def test_the_softmax_scale_and_the_rotary_factor_fold_mscale_as_transformers():
    """``(qk_nope + qk_rope) ** -0.5`` times mscale(mscale_all_dim) squared; cos/sin by the two mscales' ratio."""
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    yarn = RopeScaling(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096, mscale=0.9,
                       mscale_all_dim=0.8)
    cfg = dataclasses.replace(ModelConfig(**SHAPE), rope_scaling=yarn)
    params = {"rope_type": "yarn", "factor": 40.0, "mscale": 0.9, "mscale_all_dim": 0.8}
    assert softmax_scale(cfg) == pytest.approx(rope_utils.yarn_apply_mscale(params, 16 ** -0.5), rel=1e-15)
    assert softmax_scale(ModelConfig(**SHAPE)) == 16 ** -0.5
    ratio = rope_utils.yarn_get_mscale(40.0, 0.9) / rope_utils.yarn_get_mscale(40.0, 0.8)
    assert yarn_cos_sin_factor(yarn) == pytest.approx(ratio, rel=1e-15)
    plain = dataclasses.replace(yarn, mscale=0.0, mscale_all_dim=0.0)
    assert yarn_cos_sin_factor(plain) == pytest.approx(0.1 * math.log(40.0) + 1)


@pytest.mark.parametrize("change,key", [(dict(kv_lora_rank=0), "kv_lora_rank"), (dict(head_dim=8), "head_dim"),
                                        (dict(n_group=3), "n_group"), (dict(topk_group=3), "n_group"),
                                        (dict(num_experts_per_tok=3), "num_experts_per_tok"),
                                        (dict(topk_method="noaux_tc", architecture="deepseek_v2"), "topk_method")])
def test_a_shape_deepseek_cannot_compute_is_one_config_error(change, key):
    with pytest.raises(ConfigError, match=f"model.{key}="):
        DeepseekModel(ModelConfig(**{**SHAPE, **change}), torch.float32, "cpu")
