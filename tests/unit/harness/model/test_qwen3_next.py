"""Qwen3-Next's decoder (harness/model/qwen3_next.py) on its own: dummy weights make a working model (zero-centred
norms at 0, the DeltaNet's gated norm at 1), the named config at real size is computed (its layers built on the
meta device), partial RoPE leaves the unrotated dims alone, and a linear layer given no state says why."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.qwen3_next import GatedAttention, Qwen3NextModel, rotary_dims
from kvbench.harness.model.weights import build_model
from tests.helpers.models import load_named

TINY = ModelConfig(name="tiny-next", architecture="qwen3_next", vocab_size=97, hidden_size=32, num_layers=4,
                   num_heads=2, num_kv_heads=1, head_dim=16, layer_types=["linear_attention"] * 3 + ["full_attention"],
                   qk_norm=True, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                   linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                   moe_intermediate_size=8, shared_expert_intermediate_size=16, norm_topk_prob=True,
                   partial_rotary_factor=0.25)


def test_dummy_weights_make_unit_norms_of_each_kind():
    model = build_model(TINY, torch.float32, "cpu", seed=0)
    assert isinstance(model, Qwen3NextModel)
    norms = {n: p for n, p in model.named_parameters() if n.endswith("norm.weight")}
    assert norms["layers.0.linear_attn.norm.weight"].eq(1).all()  # a plain weight
    assert norms["layers.3.self_attn.q_norm.weight"].eq(0).all() and norms["norm.weight"].eq(0).all()  # 1 + w
    assert model.layers[0].linear_attn.A_log.std() > 0 and model.layers[0].mlp.shared_expert_gate is not None


def test_partial_rope_rotates_the_first_quarter_only():
    attn = GatedAttention(TINY, torch.float32, "cpu")
    assert rotary_dims(TINY) == attn.rotated == 4
    x = torch.randn(3, 2, 16)
    cos, sin = torch.randn(3, 4), torch.randn(3, 4)
    out = attn.rope(x, cos, sin)
    assert torch.equal(out[..., 4:], x[..., 4:]) and not torch.equal(out[..., :4], x[..., :4])


def test_a_linear_layer_without_the_caches_state_says_why():
    model = build_model(TINY, torch.float32, "cpu", seed=0)
    ids = torch.tensor([1, 2, 3])
    with pytest.raises(TypeError, match="layer 0 is a linear_attention layer: it needs the cache's state"):
        model(ids, torch.arange(3), lambda layer, q, k, v: q)


def test_the_named_config_at_real_size_is_computed():
    cfg = load_named("qwen3-next-80b-a3b")
    model = Qwen3NextModel(cfg, torch.bfloat16, "meta")
    assert sum(layer.linear for layer in model.layers) == 36
    delta = model.layers[0].linear_attn
    assert delta.state_values == 32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3  # harness/kv/latent.py's
    assert model.layers[3].self_attn.qkv_proj.weight.shape == (2 * 16 * 256 + 2 * 2 * 256, 2048)
    assert model.rotary.inv_freq.shape == (32,)  # 64 of 256 dims rotated


def test_its_decode_is_never_traced(compose, tmp_path):
    """cpu_compile=null stays eager for it; cpu_compile=true is one refusal naming the linear layers."""
    from kvbench.harness.front.job import run_job
    from kvbench.harness.model.compiled import auto_compile

    model = build_model(TINY, torch.float32, "cpu", seed=0)
    chosen, why = auto_compile(model, torch.device("cpu"), 10**6)
    assert not chosen and "linear_attention" in why
    rows, code = run_job(compose(["+impl=paged_torch", "model=qwen3-next-80b-a3b", "kv_manager=hybrid",
                                  "device=cpu", "cpu_compile=true"]), tmp_path)
    assert code != 0 and "a traced decode holds no state; allowed: cuda_graph=false" in rows[0]["error"]
