"""Qwen3-MoE's sparse MLP: greedy tokens identical to transformers' Qwen3MoeForCausalLM through the engine (contiguous
and paged caches; prefill logits: test_llama.py's HF_CASES), a published per-expert checkpoint layout loads into the
stacked experts, and seeded dummy weights route tokens to many experts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.weights import build_model
from tests.helpers.models import load_named, make_hf_model

pytest.importorskip("transformers")


def test_per_expert_checkpoint_loads_into_the_stacked_experts(tmp_path: Path) -> None:
    """Qwen3-30B-A3B's files hold mlp.experts.E.{gate,up,down}_proj.weight; transformers 5 writes them stacked."""
    from safetensors.torch import save_file

    hf = make_hf_model("qwen3-moe", seed=4)
    hf.config.save_pretrained(tmp_path)
    tensors = {}
    for name, p in hf.state_dict().items():
        if name.endswith("experts.gate_up_proj"):
            size = p.shape[1] // 2
            for e in range(p.shape[0]):
                tensors[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = p[e, :size].clone()
                tensors[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = p[e, size:].clone()
        elif name.endswith("experts.down_proj"):
            for e in range(p.shape[0]):
                tensors[name.replace("down_proj", f"{e}.down_proj.weight")] = p[e].clone()
        else:
            tensors[name] = p.contiguous()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    ours = build_model(resolve_model_config(ModelConfig(path=str(tmp_path))), torch.float32, "cpu", seed=0)
    stacked = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        if "experts" in name:
            assert torch.equal(p, stacked[f"model.{name}"]), name


def test_dummy_weights_spread_tokens_over_the_experts() -> None:
    cfg = load_named("tiny-qwen3")
    cfg.architecture, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size = "qwen3_moe", 8, 2, 96
    cfg.norm_topk_prob = True
    model = build_model(cfg, torch.float32, "cpu", seed=0)
    ids = torch.randint(0, cfg.vocab_size, (200,), generator=torch.Generator().manual_seed(0))
    chosen = []
    model.layers[0].mlp.gate.register_forward_hook(lambda m, i, o: chosen.append(o.topk(2, dim=-1).indices))
    causal = lambda layer, q, k, v: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q.transpose(0, 1), k.repeat_interleave(2, 1).transpose(0, 1), v.repeat_interleave(2, 1).transpose(0, 1),
        is_causal=True).transpose(0, 1)
    logits = model(ids, torch.arange(200), causal)
    assert torch.isfinite(logits).all() and logits.std() > 1.0
    assert len(torch.unique(chosen[0])) == 8  # every expert gets tokens


def test_a_traced_graph_runs_every_expert_to_the_same_sums() -> None:
    """cpu_compile's fullgraph trace cannot hold the chosen-experts loop: its dense form gives the same output."""
    cfg = load_named("tiny-qwen3")
    cfg.architecture, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size = "qwen3_moe", 8, 2, 96
    moe = build_model(cfg, torch.float32, "cpu", seed=0, fuse=False, prepack=False).layers[0].mlp
    x = torch.randn(5, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    weights, chosen = torch.topk(torch.softmax(moe.gate(x), -1), 2)
    torch.testing.assert_close(moe.experts.every_expert(x, chosen, weights), moe.experts(x, chosen, weights))
    traced = torch.compile(moe, fullgraph=True, backend="eager")
    torch.testing.assert_close(traced(x), moe(x))
