"""Gemma 3's decoder (harness/model/gemma3.py) against transformers' Gemma3ForCausalLM: the logits of a prefill,
each piece that differs from Llama (RoPE per kind, the norm, the embedding scale), and the paths that drive the
model's pieces (cuda_graph's, on CPU without capture)."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.kv.sizes import parameter_count
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.gemma3 import Gemma3Model, GemmaRMSNorm
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.piecewise import PiecewiseDecode
from kvbench.harness.model.weights import build_model
from kvbench.kernels.prefill import prefill_attention
from tests.helpers.models import load_named, make_hf_model

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(config, our model, transformers' model) of the gemma3-sliding checkpoint."""
    folder = tmp_path_factory.mktemp("gemma3")
    hf = make_hf_model("gemma3-sliding", seed=3)
    hf.save_pretrained(folder)
    cfg = resolve_model_config(ModelConfig(path=str(folder)))
    return cfg, build_model(cfg, torch.float32, "cpu", seed=0), hf


def _windowed(cfg: ModelConfig, scale: float):
    """Whole-prompt attention with each layer's window, the way the caches attend (kernels/prefill.py)."""
    def attend(layer, q, k, v):
        window = cfg.sliding_window if cfg.layer_types[layer] == "sliding_attention" else 0
        return prefill_attention(q, k, v, scale, window)
    return attend


def test_prefill_logits_equal_transformers(pair):
    cfg, model, hf = pair
    ids = torch.randint(0, cfg.vocab_size, (60,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
        got = model(ids, torch.arange(60), _windowed(cfg, cfg.softmax_scale))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # The scale matters here: head_dim's gives other logits.
    with torch.no_grad():
        other = model(ids, torch.arange(60), _windowed(cfg, cfg.head_dim**-0.5))
    assert not torch.allclose(other, want, atol=1e-2)


def test_each_layer_kind_gets_transformers_cos_and_sin_bit_for_bit(pair):
    cfg, model, hf = pair
    positions = torch.tensor([0, 3, 17, 40, 99, 500])
    _, cos, sin = model.embed(torch.zeros_like(positions), positions)
    x = torch.zeros(1, len(positions), cfg.hidden_size)
    for index in (0, 5):  # a sliding layer and the full one
        kind = cfg.layer_types[index]
        want_cos, want_sin = hf.model.rotary_emb(x, positions[None], kind)
        got_cos, got_sin = model.layers[index].rope(cos, sin)
        assert torch.equal(got_cos, want_cos[0]) and torch.equal(got_sin, want_sin[0]), kind
    assert not torch.equal(model.layers[0].rope(cos, sin)[0], model.layers[5].rope(cos, sin)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_norm_scales_by_one_plus_weight_in_float32_as_transformers(dtype):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    gen = torch.Generator().manual_seed(0)
    theirs = Gemma3RMSNorm(48, eps=1e-6)
    ours = GemmaRMSNorm(48, 1e-6, dtype, "cpu")
    with torch.no_grad():
        theirs.weight.normal_(0.0, 0.5, generator=gen)
        ours.weight.copy_(theirs.weight)
        theirs.to(dtype)
        x = (3 * torch.randn(5, 2, 48, generator=gen)).to(dtype)
        assert torch.equal(ours(x), theirs(x))


def test_the_embedding_scale_rounds_to_the_weights_dtype_as_transformers():
    """sqrt(5376) = 73.32 is 73.5 in bf16: transformers multiplies by the rounded scalar, in bf16."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    cfg = ModelConfig(architecture="gemma3_text", vocab_size=8, hidden_size=5376, intermediate_size=8, num_layers=1,
                      num_heads=1, num_kv_heads=1, head_dim=64, qk_norm=True, hidden_act="gelu_pytorch_tanh")
    model = Gemma3Model(cfg, torch.bfloat16, "cpu")
    theirs = Gemma3TextScaledWordEmbedding(8, 5376, 0, embed_scale=5376**0.5).to(torch.bfloat16)
    with torch.no_grad():
        model.embed_tokens.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(0))
        theirs.weight.copy_(model.embed_tokens.weight)
        ids = torch.arange(8)
        assert model.embed_scale.item() == 73.5
        assert torch.equal(model.embed(ids, ids)[0], theirs(ids))


def test_the_pieces_give_the_eager_logits(pair):
    """cuda_graph's pieces (run eagerly on the CPU) carry the packed cos/sin in their [N, head_dim] buffers."""
    cfg, model, _ = pair
    pieces = PiecewiseDecode(model, max_batch=5, capture=False)
    gen = torch.Generator().manual_seed(2)

    def attend(layer, q, k, v):  # any function of q, k, v: each token attends to itself
        return v.repeat_interleave(q.shape[1] // v.shape[1], dim=1) + 0.01 * layer * q

    for n in (1, 3, 5):
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=gen)
        pos = torch.randint(0, 100, (n,), generator=gen)
        with torch.inference_mode():
            assert torch.equal(pieces(ids, pos, attend), model(ids, pos, attend))


def test_the_fused_cpu_ops_are_left_off():
    """kernels/dense_op.py's ops compute Llama's norm and SwiGLU: a Gemma model stays on torch's ops."""
    model = build_model(load_named("tiny-gemma3"), torch.float32, "cpu", seed=0, fuse=True)
    assert not model.fused and not any(getattr(m, "fused", False) for m in model.modules())


def test_dummy_weights_are_unit_norms_and_spread_logits():
    cfg = load_named("tiny-gemma3")
    model = build_model(cfg, torch.float32, "cpu", seed=0)
    norms = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    assert len(norms) == 6 * 6 + 1 and all(torch.count_nonzero(p) == 0 for p in norms)  # 1 + w = 1
    ids = torch.randint(0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids, torch.arange(40), _windowed(resolve_model_config(cfg), cfg.softmax_scale))
    assert torch.isfinite(logits).all() and 1.0 < logits.std().item() < 10.0


@pytest.mark.parametrize("name", ["gemma-3-27b", "tiny-gemma3"])
def test_the_built_model_has_the_sized_parameters(name):
    """harness/kv/sizes.py's count (capacity runs) is the module tree's: four norms a layer, q/k norms, tied."""
    cfg = resolve_model_config(load_named(name))
    assert Gemma3Model(cfg, torch.bfloat16, "meta").num_parameter_bytes() == 2 * parameter_count(cfg)


def test_the_compiled_decode_gives_the_eager_logits(pair):
    """cpu_compile's one inductor graph traces the same pieces: Gemma runs it unchanged (unfrozen: a shorter compile;
    freezing changes the linears alone, which are Llama's)."""
    from kvbench.harness.model.compiled import CompiledDecode

    cfg, model, _ = pair
    compiled = CompiledDecode(model, max_batch=5, freeze=False)

    def attend(layer, q, k, v):
        return v.repeat_interleave(q.shape[1] // v.shape[1], dim=1) + 0.01 * layer * q

    gen = torch.Generator().manual_seed(4)
    for n in (2, 5):
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=gen)
        pos = torch.randint(0, 100, (n,), generator=gen)
        with torch.inference_mode():
            torch.testing.assert_close(compiled(ids, pos, attend), model(ids, pos, attend), rtol=1e-4, atol=1e-4)
    assert compiled.steps == 2


def test_a_checkpoint_with_a_vision_tower_loads_its_language_model(tmp_path):
    """model_type gemma3 (Gemma3ForConditionalGeneration, as google/gemma-3-27b-it ships): the text_config is read,
    the language model's tensors load from under language_model., the vision tower's are left; text-only logits
    equal transformers'."""
    import transformers

    text = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=7, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, sliding_window=24, query_pre_attn_scalar=48,
                max_position_embeddings=512)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    torch.manual_seed(0)
    hf = transformers.Gemma3ForConditionalGeneration(
        transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)).float().eval()
    with torch.no_grad():  # O(1) weights, as tests/helpers/models.py draws them for Gemma
        for name, p in hf.named_parameters():
            p.normal_(0.0, 0.3 if p.dim() == 1 else (2 * 64**-0.5 if "embed_tokens" in name else p.shape[1] ** -0.5))
    hf.save_pretrained(tmp_path)
    cfg = resolve_model_config(ModelConfig(path=str(tmp_path)))
    assert cfg.architecture == "gemma3_text" and cfg.tie_word_embeddings and cfg.softmax_scale == 48**-0.5
    model = build_model(cfg, torch.float32, "cpu", seed=0)
    ids = torch.randint(3, 160, (40,), generator=torch.Generator().manual_seed(0))  # no image tokens
    with torch.no_grad():
        want = hf(input_ids=ids[None]).logits[0]
        got = model(ids, torch.arange(40), _windowed(cfg, cfg.softmax_scale))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_scaled_rope_on_the_sliding_layers_is_refused_naming_the_key(tmp_path):
    """transformers would scale the sliding layers' RoPE if a file said so; no Gemma 3 does, and kvbench does not."""
    import json

    from kvbench.harness.errors import ConfigError

    raw = {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 160,
           "intermediate_size": 96, "num_hidden_layers": 6, "sliding_window": 24,
           "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"rope_parameters\.sliding_attention\.rope_type='linear'.*allowed: default"):
        resolve_model_config(ModelConfig(path=str(tmp_path)))
