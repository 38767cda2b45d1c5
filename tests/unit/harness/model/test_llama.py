"""The Llama-family model against Hugging Face transformers, and the loaders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from kvbench.harness.errors import ConfigError
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.llama import LlamaModel
from kvbench.harness.model.weights import build_model

transformers = pytest.importorskip("transformers")

from tests.conftest import REPO_ROOT as REPO
from tests.helpers.models import HF_CASES, MODEL_YAMLS, load_named, make_hf_model  # noqa: F401


# ---------------------------------------------------------------- attention callables


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [T, H, D], k/v [L, KVH, D], bool mask [T, L] -> [T, H, D]; GQA by repeating K/V heads."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask)
    return out.transpose(0, 1)


def full_causal(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One sequence, the whole prompt in this forward."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    return out.transpose(0, 1)


def block_causal(seq_ids: torch.Tensor):
    """Several prompts concatenated in one flat batch: causal within each, blind across."""
    tokens = len(seq_ids)
    mask = (seq_ids[:, None] == seq_ids[None, :]) & torch.ones(tokens, tokens, dtype=torch.bool).tril()
    return lambda layer, q, k, v: _sdpa(q, k, v, mask)


class ToyCache:
    """Per-sequence K/V lists: a minimal KV cache for prefill + flat decode steps."""

    def __init__(self) -> None:
        self.kv: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def attention(self, seq_of_token: list[int]):
        seqs = torch.tensor(seq_of_token)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = torch.empty_like(q)
            for seq in dict.fromkeys(seq_of_token):
                rows = (seqs == seq).nonzero().flatten()
                old_k, old_v = self.kv.get((seq, layer), (k[:0], v[:0]))
                keys, values = torch.cat([old_k, k[rows]]), torch.cat([old_v, v[rows]])
                self.kv[(seq, layer)] = (keys, values)
                new, total = len(rows), len(keys)
                mask = torch.ones(new, total, dtype=torch.bool).tril(total - new)
                out[rows] = _sdpa(q[rows], keys, values, mask)
            return out

        return attend


# ---------------------------------------------------------------- HF reference models

def hf_logits(model: Any, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids[None], position_ids=positions[None]).logits[0].float()


def ours_from(folder: Path) -> LlamaModel:
    return build_model(resolve_model_config(ModelConfig(path=str(folder))), torch.float32, "cpu", seed=0)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_matches_hf_prefill(case: str, tmp_path: Path) -> None:
    hf = make_hf_model(case)
    hf.save_pretrained(tmp_path)
    ours = ours_from(tmp_path)
    assert ours.cfg.architecture == HF_CASES[case][0] and ours.cfg.weights == "path"
    ids = torch.randint(0, 160, (23,), generator=torch.Generator().manual_seed(1))
    # Offset positions: RoPE must use `positions`, not the row index.
    positions = torch.arange(23) + (37 if case == "llama3-rope-tied" else 0)
    expected = hf_logits(hf, ids, positions)
    assert expected.std() > 0.5  # the comparison is not vacuous
    got = ours(ids, positions, full_causal)
    assert got.dtype == torch.float32 and got.shape == (23, 160)
    torch.testing.assert_close(got, expected, atol=3e-5, rtol=1e-5)


def test_flat_batch_of_two_sequences_matches_hf(tmp_path: Path) -> None:
    hf = make_hf_model("llama3-rope-tied")
    hf.save_pretrained(tmp_path)
    ours = ours_from(tmp_path)
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randint(0, 160, (7,), generator=gen), torch.randint(0, 160, (12,), generator=gen)
    ids = torch.cat([a, b])
    positions = torch.cat([torch.arange(7), torch.arange(12)])
    seq_ids = torch.tensor([0] * 7 + [1] * 12)
    got = ours(ids, positions, block_causal(seq_ids))
    exp_a, exp_b = hf_logits(hf, a, torch.arange(7)), hf_logits(hf, b, torch.arange(12))
    torch.testing.assert_close(got[:7], exp_a, atol=3e-5, rtol=1e-5)
    torch.testing.assert_close(got[7:], exp_b, atol=3e-5, rtol=1e-5)
    # logits_indices: only each sequence's last token gets logits.
    last = ours(ids, positions, block_causal(seq_ids), logits_indices=torch.tensor([6, 18]))
    assert last.shape == (2, 160)
    torch.testing.assert_close(last, torch.stack([exp_a[-1], exp_b[-1]]), atol=3e-5, rtol=1e-5)


def test_sharded_checkpoint_loads(tmp_path: Path) -> None:
    hf = make_hf_model("qwen2-tied", seed=3)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    ours = ours_from(tmp_path)
    ids = torch.randint(0, 160, (9,), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(
        ours(ids, torch.arange(9), full_causal), hf_logits(hf, ids, torch.arange(9)), atol=3e-5, rtol=1e-5
    )


def test_checkpoint_not_matching_config_json_is_config_error(tmp_path: Path) -> None:
    make_hf_model("llama-gqa").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["intermediate_size"] = 128
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"model\.path=.*mlp\.\w+_proj.*config\.json implies"):
        ours_from(tmp_path)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_safetensors_names_model_path_and_file(tmp_path: Path, damage: str) -> None:
    make_hf_model("llama-gqa").save_pretrained(tmp_path)
    (file,) = tmp_path.glob("*.safetensors")
    data = file.read_bytes()
    file.write_bytes(b"\x07" * 64 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(ConfigError, match=rf"model\.path={tmp_path}: {file.name} is not a readable safetensors"):
        ours_from(tmp_path)


# ---------------------------------------------------------------- config.json reading


def test_published_config_json_layout(tmp_path: Path) -> None:
    """Hub checkpoints use top-level rope_theta + rope_scaling {type: llama3} (pre-5.x keys)."""
    raw = dict(
        model_type="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        rope_scaling=dict(
            type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
        ),
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
    )
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = resolve_model_config(ModelConfig(path=str(tmp_path)))
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (32, 32, 8, 128)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling is not None and cfg.rope_scaling.factor == 8.0
    assert cfg.weights == "path" and not cfg.qkv_bias and cfg.max_position_embeddings == 131072


@pytest.mark.parametrize(
    "setup, message",
    [
        ("missing", r"model\.path=.* has no config\.json"),
        ("empty", r"model\.path=.* has no config\.json"),
        ("gpt2", r"model\.path=.*'gpt2'.*llama, mistral, qwen2"),
        ("yarn", r"model\.path=.*'yarn'"),
    ],
)
def test_bad_model_path_is_config_error(setup: str, message: str, tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    if setup != "missing":
        folder.mkdir()
    base = dict(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    if setup == "gpt2":
        (folder / "config.json").write_text(json.dumps(dict(base, model_type="gpt2")))
    if setup == "yarn":
        raw = dict(base, model_type="qwen2", rope_scaling=dict(type="yarn", factor=4.0))
        (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=message):
        resolve_model_config(ModelConfig(path=str(folder)))


@pytest.mark.parametrize(
    "override, key",
    [
        (dict(num_kv_heads=3), "model.num_kv_heads"),
        (dict(architecture="gpt2"), "model.architecture"),
        (dict(hidden_size=0), "model.hidden_size"),
        (dict(weights="path"), "model.path"),
    ],
)
def test_bad_shape_is_config_error(override: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resolve_model_config(ModelConfig(**override))


# ---------------------------------------------------------------- dummy weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dummy_weights_finite_and_spread_over_300_positions(dtype: torch.dtype) -> None:
    cfg = load_named("tiny-llama")
    model = build_model(cfg, dtype, "cpu", seed=0)
    assert not any(p.requires_grad for p in model.parameters()) and not model.training
    ids = torch.randint(0, cfg.vocab_size, (300,), generator=torch.Generator().manual_seed(0))
    logits = model(ids, torch.arange(300), full_causal)
    assert torch.isfinite(logits).all()
    std = logits.std(dim=-1)
    assert 2.0 < std.min() and std.max() < 8.0
    top2 = logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).median() > 0.3  # argmaxes are not near-ties


def test_dummy_weights_seeded() -> None:
    cfg = load_named("tiny-qwen2")
    a, b, c = (build_model(cfg, torch.float32, "cpu", seed=s).state_dict() for s in (0, 0, 1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not any(torch.equal(a[k], c[k]) for k in a if not k.endswith("norm.weight"))


def test_decode_steps_match_prefill() -> None:
    """Prefill, then flat decode batches (one token per sequence) through a toy cache,
    give the logits a single full prefill gives: positions and K/V flow correctly."""
    cfg = load_named("tiny-mistral")
    model = build_model(cfg, torch.float32, "cpu", seed=5)
    gen = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, cfg.vocab_size, (n,), generator=gen) for n in (11, 14)]
    prompt = [5, 9]
    cache = ToyCache()
    ids = torch.cat([s[:n] for s, n in zip(seqs, prompt)])
    positions = torch.cat([torch.arange(n) for n in prompt])
    model(ids, positions, cache.attention([0] * 5 + [1] * 9))
    steps = []
    for pos_a, pos_b in zip(range(5, 11), range(9, 14)):
        ids = torch.stack([seqs[0][pos_a], seqs[1][pos_b]])
        steps.append(model(ids, torch.tensor([pos_a, pos_b]), cache.attention([0, 1])))
    for i, (seq, start) in enumerate(zip(seqs, prompt)):
        full = model(seq, torch.arange(len(seq)), full_causal)
        got = torch.stack([step[i] for step in steps])
        torch.testing.assert_close(got, full[start : start + len(steps)], atol=1e-4, rtol=1e-5)


def test_varying_shape_sdpa_drops_only_cudnn_and_respects_an_outer_choice():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kvbench.kernels.sdpa import shape_stable_backends

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]):
        assert shape_stable_backends() == [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        assert shape_stable_backends() == [SDPBackend.EFFICIENT_ATTENTION]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 5])
def test_qkv_and_norm_equal_the_op_at_a_time_formulation(dtype: torch.dtype, tokens: int) -> None:
    """Attention.qkv rotates q's and k's heads in one pass and RMSNorm updates its statistics in place
    (issue 23's lean step): both give HF's op-at-a-time arithmetic bit for bit, and q, k, v are dense."""
    from kvbench.harness.model.rope import apply_rotary

    cfg = load_named("tiny-llama")
    model = build_model(cfg, dtype, "cpu", seed=3, fuse=False)  # torch's ops (the fused ones: test_llama_fused.py)
    layer = model.layers[0]
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(tokens, cfg.hidden_size, generator=gen).to(dtype)
    positions = torch.arange(7, 7 + tokens)
    cos, sin = model.rotary(positions, dtype)

    norm = layer.input_layernorm
    x32 = h.float()
    want_norm = norm.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)).to(dtype)
    x = norm(h)
    assert torch.equal(x, want_norm)

    attn = layer.self_attn
    q, k, v = attn.qkv_proj(x).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    want = (apply_rotary(q.view(tokens, attn.num_heads, attn.head_dim), cos, sin),
            apply_rotary(k.view(tokens, attn.num_kv_heads, attn.head_dim), cos, sin),
            v.reshape(tokens, attn.num_kv_heads, attn.head_dim))
    got = attn.qkv(x, cos, sin)
    for g, w in zip(got, want):
        assert g.is_contiguous() and torch.equal(g, w)
