"""gpt-oss against transformers' GptOssForCausalLM at the model level: prefill logits through a plain attention with
sinks and windows written here (the caches' kernels: tests/unit/harness/serving/test_engine_parity_gpt_oss.py), each
module against its transformers counterpart, the checkpoint's tensors, dummy weights and the traced experts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvbench.harness.errors import ConfigError
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.gpt_oss import GptOssModel, GptOssRMSNorm, clamped_swiglu
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.weights import build_model
from tests.helpers.models import load_named, make_hf_model

transformers = pytest.importorskip("transformers")


def sink_attention(windows: list[int], sinks: list[torch.Tensor] | None):
    """One sequence's causal attention, the whole prompt in one forward, as the rule reads: a softmax over each
    query's visible scores (the last ``window`` keys of a sliding layer) and its head's sink, the sink dropped."""

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        tokens, heads, dim = q.shape
        group = heads // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("thd,shd->hts", q, k) * dim**-0.5
        i = torch.arange(tokens)
        seen = i[None, :] <= i[:, None]
        if windows[layer]:
            seen &= i[:, None] - i[None, :] < windows[layer]
        scores = scores.masked_fill(~seen, float("-inf"))
        if sinks is not None:
            scores = torch.cat([scores, sinks[layer][:, None, None].expand(heads, tokens, 1)], dim=-1)
        probs = torch.softmax(scores, dim=-1)[..., :tokens]
        return torch.einsum("hts,shd->thd", probs, v)

    return attend


@pytest.fixture(scope="module", params=["gpt-oss-sliding", "gpt-oss"])
def pair(request, tmp_path_factory):
    """(our model loaded from the checkpoint, transformers' model) of a tiny random gpt-oss."""
    folder = tmp_path_factory.mktemp(request.param)
    hf = make_hf_model(request.param, seed=7)
    hf.save_pretrained(folder)
    cfg = resolve_model_config(ModelConfig(path=str(folder)))
    return build_model(cfg, torch.float32, "cpu", seed=0), hf


def _windows(cfg: ModelConfig) -> list[int]:
    assert cfg.layer_types is not None and cfg.sliding_window is not None
    return [cfg.sliding_window if kind == "sliding_attention" else 0 for kind in cfg.layer_types]


def _logits(model: GptOssModel, ids: torch.Tensor, windows: list[int], sinks=True) -> torch.Tensor:
    attend = sink_attention(windows, model.layer_sinks() if sinks else None)
    return model(ids, torch.arange(len(ids)), attend)


def _hf_logits(hf, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=ids[None]).logits[0].float()


def test_the_checkpoint_reads_as_gpt_oss(pair):
    cfg = pair[0].cfg
    assert cfg.architecture == "gpt_oss" and cfg.attention_sinks and cfg.qkv_bias and cfg.o_bias
    assert cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == "yarn"
    assert cfg.layer_types[:2] == ["sliding_attention", "full_attention"]


def test_prefill_logits_equal_transformers_past_the_window(pair):
    model, hf = pair
    ids = torch.randint(0, model.cfg.vocab_size, (70,), generator=torch.Generator().manual_seed(1))
    ours, want = _logits(model, ids, _windows(model.cfg)), _hf_logits(hf, ids)
    torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(ours.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("missing", ["sinks", "windows", "yarn's attention factor"])
def test_each_detail_changes_the_logits(pair, missing, monkeypatch):
    """The comparison above can fail: without the sinks, the windows or yarn's factor on cos/sin, the logits move."""
    model, hf = pair
    ids = torch.randint(0, model.cfg.vocab_size, (70,), generator=torch.Generator().manual_seed(1))
    windows = [0] * model.cfg.num_layers if missing == "windows" else _windows(model.cfg)
    if missing == "yarn's attention factor":
        assert model.rotary.attention_factor > 1.3  # 0.1 ln(32) + 1
        monkeypatch.setattr(model.rotary, "attention_factor", 1.0)
    ours = _logits(model, ids, windows, sinks=missing != "sinks")
    assert (ours - _hf_logits(hf, ids)).abs().max() > 1e-2


def test_the_checkpoints_tensors_land_where_transformers_keeps_them(pair):
    model, hf = pair
    theirs = dict(hf.named_parameters())
    for name, p in model.named_parameters():
        if "qkv_proj" not in name:
            assert torch.equal(p, theirs[name if name.startswith("lm_head") else f"model.{name}"]), name
    assert [s.dtype for s in model.layer_sinks()] == [torch.float32] * model.cfg.num_layers


def test_the_moe_equals_transformers_mlp_in_both_its_experts_paths(pair):
    """Router (top-k logits, softmax over them) and experts (interleaved gate/up, clamps, biases) against
    GptOssMLP under transformers' default grouped_mm path and its eager loop."""
    model, hf = pair
    x = torch.randn(37, model.cfg.hidden_size, generator=torch.Generator().manual_seed(2)) * 3
    ours = model.layers[1].mlp(x)
    for impl in ("grouped_mm", "eager"):
        hf.config._experts_implementation = impl
        with torch.no_grad():
            want, _ = hf.model.layers[1].mlp(x[None])
        torch.testing.assert_close(ours, want[0], rtol=1e-5, atol=1e-5)
    hf.config._experts_implementation = "grouped_mm"


def test_the_clamped_swiglu_is_transformers_and_the_clamps_bite():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    experts = GptOssExperts(transformers.GptOssConfig(hidden_size=64, intermediate_size=96, num_local_experts=2,
                                                      swiglu_limit=1.2))
    gate_up = torch.randn(50, 2 * 96, generator=torch.Generator().manual_seed(3)) * 2
    assert torch.equal(clamped_swiglu(gate_up, 1.2), experts._apply_gate(gate_up))
    assert not torch.equal(clamped_swiglu(gate_up, 100.0), experts._apply_gate(gate_up))
    # gate columns are the even ones: swapping the halves' layout changes the output
    split = torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], dim=1)
    assert not torch.allclose(clamped_swiglu(split, 1.2), clamped_swiglu(gate_up, 1.2))


def test_rms_norm_multiplies_in_float32_as_transformers_at_bfloat16():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRMSNorm as HFNorm

    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(9, 64, generator=gen).bfloat16() * 5, 1 + 0.3 * torch.randn(64, generator=gen)
    ours = GptOssRMSNorm(64, 1e-5, torch.bfloat16, "cpu")
    ours.weight.data.copy_(w)  # a bf16 checkpoint's weight, which transformers keeps in float32
    theirs = HFNorm(64, eps=1e-5)
    theirs.weight.data.copy_(w.bfloat16().float())
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))


def test_a_traced_graph_runs_every_expert_to_the_same_sums(pair):
    moe = pair[0].layers[0].mlp
    x = torch.randn(6, pair[0].cfg.hidden_size, generator=torch.Generator().manual_seed(5))
    chosen, weights = moe.route(x)
    torch.testing.assert_close(moe.experts.every_expert(x, chosen, weights), moe.experts(x, chosen, weights))
    traced = torch.compile(moe, fullgraph=True, backend="eager")
    torch.testing.assert_close(traced(x), moe(x))


def _tiny_named() -> ModelConfig:
    """gpt-oss-20b's config at a tiny size: yarn, sinks, clamps, MXFP4 experts computed at the run's dtype."""
    cfg = load_named("gpt-oss-20b")
    cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads = 512, 128, 2, 4, 2
    cfg.moe_intermediate_size = cfg.intermediate_size = 96
    cfg.layer_types, cfg.num_experts = cfg.layer_types[:2], 8
    return cfg


def test_dummy_weights_are_finite_spread_over_the_experts_and_give_sinks_a_share():
    model = build_model(_tiny_named(), torch.float32, "cpu", seed=0)
    assert model.cfg.expert_dtype == "mxfp4"
    ids = torch.randint(0, 512, (300,), generator=torch.Generator().manual_seed(0))
    chosen = []
    model.layers[0].mlp.router.register_forward_hook(lambda m, i, o: chosen.append(o.topk(4, dim=-1).indices))
    logits = _logits(model, ids, _windows(model.cfg))
    assert torch.isfinite(logits).all() and logits.std() > 1.0
    assert len(torch.unique(chosen[0])) == 8
    without = _logits(model, ids, _windows(model.cfg), sinks=False)
    assert (without.argmax(-1) != logits.argmax(-1)).float().mean() > 0.02


def test_a_model_missing_a_gpt_oss_detail_is_refused_by_name():
    cfg = _tiny_named()
    cfg.attention_sinks = False
    with pytest.raises(ConfigError, match=r"model\.architecture=gpt_oss needs .* attention_sinks=False"):
        GptOssModel(cfg, torch.float32, "meta")


def test_an_mxfp4_checkpoint_is_refused_in_one_line(tmp_path: Path):
    import json

    make_hf_model("gpt-oss").config.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "mxfp4"}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"model\.expert_dtype=mxfp4 .*dequantize") as err:
        build_model(ModelConfig(path=str(tmp_path)), torch.float32, "cpu", seed=0)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name, published", [("gpt-oss-20b", 20.9e9), ("gpt-oss-120b", 116.8e9)])
def test_the_real_sizes_build_with_the_parameters_kvbench_prices(name: str, published: float):
    """On the meta device (no memory): the module tree holds the count harness/kv/sizes.py prices, the model
    card's within its rounding."""
    from kvbench.harness.kv.sizes import parameter_count

    cfg = resolve_model_config(load_named(name))
    count = sum(p.numel() for p in GptOssModel(cfg, torch.bfloat16, "meta").parameters())
    assert count == parameter_count(cfg) and abs(count / published - 1) < 0.005
