"""Qwen3 in the Llama-family decoder: greedy tokens identical to transformers' Qwen3ForCausalLM through the engine,
on the contiguous cache and a paged one (the per-head q/k norms before RoPE; prefill logits: test_llama.py's
HF_CASES), and the q/k norm path equal to HF's op order on the fused CPU model too."""

from __future__ import annotations


import pytest
import torch

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.weights import build_model
from tests.helpers.models import make_hf_model

pytest.importorskip("transformers")


@pytest.mark.parametrize("fuse", [False, True])
def test_qk_norms_before_rope_match_hf(tmp_path, fuse):
    """Prefill logits of a fused / plain CPU model (the fused rope_qkv op has no norm: the q/k norm path
    bypasses it) against HF's, and the norms are really there: dropping them changes the logits."""
    from kvbench.kernels.dense_op import dense_ops_unavailable

    if fuse and dense_ops_unavailable() is not None:
        pytest.skip(dense_ops_unavailable())
    hf = make_hf_model("qwen3", seed=2)
    hf.save_pretrained(tmp_path)
    cfg = resolve_model_config(ModelConfig(path=str(tmp_path)))
    ours = build_model(cfg, torch.float32, "cpu", seed=0, fuse=fuse, prepack=False)
    assert ours.layers[0].self_attn.q_norm is not None
    ids = torch.randint(0, 160, (17,), generator=torch.Generator().manual_seed(3))
    causal = _causal
    with torch.no_grad():
        want = hf(input_ids=ids[None]).logits[0]
    torch.testing.assert_close(ours(ids, torch.arange(17), causal), want, atol=3e-5, rtol=1e-5)
    for layer in ours.layers:
        layer.self_attn.q_norm = layer.self_attn.k_norm = None
    assert not torch.allclose(ours(ids, torch.arange(17), causal), want, atol=1e-2)


def _causal(layer, q, k, v):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                           is_causal=True)
    return out.transpose(0, 1)
