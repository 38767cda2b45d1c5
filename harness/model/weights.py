"""Filling a LlamaModel: seeded dummy weights, or a local safetensors checkpoint."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import torch

from kvbench.harness.errors import ConfigError
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.families import model_class
from kvbench.harness.model.llama import LlamaModel, fuse_supported, prepack_supported
from kvbench.harness.model.support import compute_refusal

# Dummy-weight scales (all N(0, std^2), norms = unit norms, drawn directly in the model dtype):
#   lm_head           LOGIT_STD / sqrt(hidden): the final RMSNorm gives unit-rms rows,
#                     so logits have std ~LOGIT_STD. A spread of a few units keeps the
#                     top-1/top-2 gap far above bf16 rounding, so greedy tokens agree
#                     across KV-cache impls instead of flipping on near-ties.
#   embed_tokens      EMBED_STD (untied); tied: the lm_head scale, as it doubles as it.
#   qkv, gate_up      1 / sqrt(hidden): unit-variance q/k, so attention scores ~N(0, 1)
#                     after the head_dim**-0.5 scale: neither uniform nor one-hot.
#   o_proj, down      BRANCH_GAIN / sqrt(fan_in * 2 * num_layers): each of the 2L
#                     residual branches adds ~GAIN^2/(2L) variance (GPT-2's depth-scaled
#                     init), so the residual stream stays bounded (rms ~5) at any depth
#                     and context length. The gain makes layer outputs, not the token's
#                     own embedding, dominate the final state: hiding one early token
#                     from attention then changes ~25% of later argmaxes (gain 1: ~3%),
#                     so a KV-cache bug shows up in the greedy tokens.
#   biases            BIAS_STD (gpt-oss's experts' biases too).
#   sinks             SINK_STD: gpt-oss's per-head sink logits, of the order of the scores, so a sink takes a
#                     visible share of short contexts' softmax and little of long ones'.
# Measured on tiny-llama over 300 positions (fp32 and bf16): logit std 4.0, median
# top-1/top-2 gap ~0.7, finite throughout. Tied models (embedding = lm_head) still
# drift into short greedy cycles after a few dozen tokens.
LOGIT_STD = 4.0
EMBED_STD = 1.0
BRANCH_GAIN = 8.0
BIAS_STD = 0.1
SINK_STD = 1.0


def _dummy_std(name: str, cfg: ModelConfig) -> float | None:
    """Standard deviation for parameter ``name``; None means fill with ones (norms)."""
    hidden, layers = cfg.hidden_size, cfg.num_layers
    head_std = LOGIT_STD / math.sqrt(hidden)
    if name.endswith("norm.weight"):
        return None
    if name.endswith((".bias", "experts.gate_up_proj_bias", "experts.down_proj_bias")):
        return BIAS_STD
    if name.endswith("self_attn.sinks"):
        return SINK_STD
    if cfg.linear_num_value_heads:  # Qwen3-Next (harness/model/qwen3_next.py, gated_delta.py)
        linear = _linear_attention_std(name, cfg)
        if linear is not None:
            return linear
    if cfg.kv_lora_rank:  # MLA (harness/model/deepseek.py): each projection by its own fan-in
        latent = _latent_std(name, cfg)
        if latent is not None:
            return latent
    if name == "embed_tokens.weight":
        return head_std if cfg.tie_word_embeddings else EMBED_STD
    if name == "lm_head.weight":
        return head_std
    if name.endswith(("qkv_proj.weight", "gate_up_proj.weight", "mlp.gate.weight", "mlp.router.weight",
                      "experts.gate_up_proj")):
        return 1.0 / math.sqrt(hidden)
    if name.endswith("experts.down_proj"):  # a mixture's output is a weighted mean of its chosen experts'
        return BRANCH_GAIN / math.sqrt(cfg.moe_intermediate_size * 2 * layers)
    if name.endswith("o_proj.weight"):
        return BRANCH_GAIN / math.sqrt(cfg.q_size * 2 * layers)
    if name.endswith("down_proj.weight"):
        return BRANCH_GAIN / math.sqrt(cfg.intermediate_size * 2 * layers)
    raise AssertionError(f"no dummy scale for {name}")


def _linear_attention_std(name: str, cfg: ModelConfig) -> float | None:
    """Qwen3-Next's DeltaNet projections, convolution and decay parameters, and its gated shared expert (None:
    the shared rules apply). A_log ~ N(0, BIAS_STD^2) decays the state by about exp(-softplus(a + dt_bias)) a
    token: it forgets over a few tokens, so the state matters and stays bounded."""
    if name.endswith(("linear_attn.A_log", "linear_attn.dt_bias")):
        return BIAS_STD
    if name.endswith("linear_attn.conv1d.weight"):
        return 1.0 / math.sqrt(cfg.linear_conv_kernel_dim)
    if name.endswith(("in_proj_qkvz.weight", "in_proj_ba.weight", "shared_expert_gate.weight",
                      "shared_expert.gate_proj.weight", "shared_expert.up_proj.weight")):
        return 1.0 / math.sqrt(cfg.hidden_size)
    if name.endswith("linear_attn.out_proj.weight"):
        values = cfg.linear_num_value_heads * cfg.linear_value_head_dim
        return BRANCH_GAIN / math.sqrt(values * 2 * cfg.num_layers)
    if name.endswith("shared_expert.down_proj.weight"):
        return BRANCH_GAIN / math.sqrt(cfg.shared_expert_intermediate_size * 2 * cfg.num_layers)
    return None


def _latent_std(name: str, cfg: ModelConfig) -> float | None:
    """MLA's projections and DeepSeek's router bias and shared experts (None: the shared rules apply)."""
    if name.endswith("e_score_correction_bias"):
        return BIAS_STD
    if name.endswith(("q_proj.weight", "q_a_proj.weight", "kv_a_proj_with_mqa.weight",
                      "shared_experts.gate_proj.weight", "shared_experts.up_proj.weight")):
        return 1.0 / math.sqrt(cfg.hidden_size)
    if name.endswith("q_b_proj.weight"):
        return 1.0 / math.sqrt(cfg.q_lora_rank or cfg.hidden_size)
    if name.endswith("kv_b_proj.weight"):
        return 1.0 / math.sqrt(cfg.kv_lora_rank)
    if name.endswith("self_attn.o_proj.weight"):
        return BRANCH_GAIN / math.sqrt(cfg.num_heads * cfg.v_head_dim * 2 * cfg.num_layers)
    if name.endswith("shared_experts.down_proj.weight"):
        return BRANCH_GAIN / math.sqrt(max(1, cfg.moe_intermediate_size * cfg.n_shared_experts) * 2 * cfg.num_layers)
    return None


def init_dummy_weights(model: LlamaModel, seed: int) -> None:
    """Seeded, in place, on the model's device: same seed + device => same weights.

    The generator lives on the target device and each tensor is drawn in its own
    dtype, so an 8B model on a GPU initialises in well under a second with no fp32
    staging copy.
    """
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for name, param in model.named_parameters():
        std = _dummy_std(name, model.cfg)
        if std is None:  # a unit norm: weight 1, or 0 where the norm scales by 1 + weight (Gemma's UNIT_NORM_WEIGHT)
            per_norm = getattr(model, "unit_norm_weight", None)  # a family whose norms differ (Qwen3-Next)
            param.fill_(per_norm(name) if per_norm is not None else getattr(model, "UNIT_NORM_WEIGHT", 1.0))
        else:
            param.normal_(0.0, std, generator=gen)


def _checkpoint_files(folder: Path, path: str) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError, OSError) as err:
            raise ConfigError(f"model.path={path}: {index.name} is unreadable ({type(err).__name__}: {err})") from err
        files = [folder / shard for shard in shards]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"model.path={path} has no *.safetensors files")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ConfigError(f"model.path={path}: shards listed in the index are missing: {missing}")
    return files


# A Gemma 3 checkpoint with a vision tower (model_type gemma3, Gemma3ForConditionalGeneration as published and as
# transformers 5 saves it) nests the language model under language_model. (transformers' in-memory layout:
# model.language_model.); its vision tower and projector are not loaded (harness/model/hf_families.py models the
# language model alone).
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
LANGUAGE_MODEL_PREFIXES = {"language_model.model.": "model.", "model.language_model.": "model.",
                           "language_model.lm_head.": "lm_head."}


def _language_model_name(hf_name: str) -> str:
    """A multimodal checkpoint's language-model tensor under its causal LM's name; any other name as it is."""
    for prefix, plain in LANGUAGE_MODEL_PREFIXES.items():
        if hf_name.startswith(prefix):
            return plain + hf_name.removeprefix(prefix)
    return hf_name


def _target(hf_name: str, cfg: ModelConfig) -> tuple[str, int, int | None]:
    """HF tensor name -> (our parameter, first row, rows); rows None = whole tensor.

    q/k/v land in row ranges of the fused ``qkv_proj``, gate/up in ``gate_up_proj``.
    """
    name = hf_name.removeprefix("model.")
    m = re.fullmatch(r"(layers\.\d+\.self_attn)\.([qkv])_proj\.(weight|bias)", name)
    if m and not cfg.kv_lora_rank:  # MLA's q_proj (V2-Lite) is its own module (harness/model/deepseek.py)
        q_rows = cfg.q_size * (2 if cfg.architecture == "qwen3_next" else 1)  # Qwen3-Next: each head's query and gate
        start = {"q": 0, "k": q_rows, "v": q_rows + cfg.kv_size}[m[2]]
        rows = q_rows if m[2] == "q" else cfg.kv_size
        return f"{m[1]}.qkv_proj.{m[3]}", start, rows
    m = re.fullmatch(r"(layers\.\d+\.mlp)\.(gate|up)_proj\.weight", name)
    if m:
        start = 0 if m[2] == "gate" else cfg.intermediate_size
        return f"{m[1]}.gate_up_proj.weight", start, cfg.intermediate_size
    # A per-expert checkpoint (Qwen3-30B-A3B as published) into transformers 5's stacked experts, whose rows
    # are counted over the leading dimensions: expert e's gate at e * 2I, its up at e * 2I + I, its down at e * H.
    m = re.fullmatch(r"(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight", name)
    if m:
        expert, size = int(m[2]), cfg.moe_intermediate_size
        if m[3] == "down":
            return f"{m[1]}.down_proj", expert * cfg.hidden_size, cfg.hidden_size
        return f"{m[1]}.gate_up_proj", expert * 2 * size + (size if m[3] == "up" else 0), size
    return name, 0, None


def _extra_layer(hf_name: str, cfg: ModelConfig) -> bool:
    """A DeepSeek-V3 tensor of a layer past num_hidden_layers (the published checkpoint's layer 61 is its
    multi-token-prediction module, which transformers' ``_keys_to_ignore_on_load_unexpected`` skips)."""
    m = re.match(r"model\.layers\.(\d+)\.", hf_name)
    return cfg.architecture == "deepseek_v3" and m is not None and int(m[1]) >= cfg.num_layers


@contextlib.contextmanager
def _open_checkpoint(file: Path, path: str) -> Iterator:
    """``safe_open`` whose failures (a truncated or corrupt file) name ``model.path`` and the file."""
    from safetensors import SafetensorError, safe_open

    try:
        handle = safe_open(str(file), framework="pt", device="cpu")
    except (SafetensorError, OSError) as err:
        raise ConfigError(f"model.path={path}: {file.name} is not a readable safetensors file ({err})") from err
    with handle as f:
        try:
            yield f
        except (SafetensorError, OSError) as err:  # a tensor's bytes past the end of a truncated file
            raise ConfigError(f"model.path={path}: {file.name} is not a readable safetensors file ({err})") from err


def load_safetensors_weights(model: LlamaModel, path: str) -> None:
    """Copy every tensor of the (single or sharded) checkpoint at ``path`` into ``model``.

    Strict both ways: an unknown tensor or a parameter left unfilled is a
    ConfigError, so a checkpoint of another architecture cannot load silently.
    """
    cfg, folder = model.cfg, Path(path).expanduser()
    params = dict(model.named_parameters())
    filled: dict[str, int] = defaultdict(int)
    for file in _checkpoint_files(folder, path):
        with _open_checkpoint(file, path) as f:
            for hf_name in f.keys():
                if hf_name.endswith("rotary_emb.inv_freq") or hf_name.startswith(VISION_PREFIXES):
                    continue  # derived from the config, saved by old transformers; a vision tower kvbench runs not
                if _extra_layer(hf_name, cfg):
                    continue  # DeepSeek-V3's multi-token-prediction layer: transformers does not load it either
                target, start, rows = _target(_language_model_name(hf_name), cfg)
                if target == "lm_head.weight" and cfg.tie_word_embeddings:
                    continue  # some tied checkpoints store a copy of the embedding
                if target not in params:
                    raise ConfigError(f"model.path={path}: unexpected tensor {hf_name} in {file.name}")
                param = params[target]
                # rows of a stacked tensor ([E, rows, cols]) count over its leading dimensions
                flat = param.view(-1, param.shape[-1]) if param.dim() > 2 else param
                dest = param if rows is None else flat[start : start + rows]
                tensor = f.get_tensor(hf_name)
                if tensor.shape != dest.shape:
                    raise ConfigError(
                        f"model.path={path}: {hf_name} has shape {tuple(tensor.shape)}, "
                        f"config.json implies {tuple(dest.shape)}"
                    )
                dest.copy_(tensor)
                filled[target] += dest.numel()
    unfilled = [n for n, p in params.items() if filled[n] != p.numel()]
    if unfilled:
        raise ConfigError(f"model.path={path}: checkpoint lacks (or repeats) weights for {unfilled[:5]}")


def prepack_default(device: torch.device | str, dtype: torch.dtype) -> bool:
    """build_model's ``prepack=None``: on wherever it applies (a float32 model on a CPU with oneDNN),
    unless the environment says ``KVBENCH_CPU_PREPACK=0``."""
    return os.environ.get("KVBENCH_CPU_PREPACK", "1") != "0" and prepack_supported(device, dtype)


def fuse_default(device: torch.device | str, dtype: torch.dtype) -> bool:
    """build_model's ``fuse=None``: on wherever the fused element-wise ops apply (a float32 model on a CPU)
    and load (kernels/dense_op.py: a C++ compiler built them), unless ``KVBENCH_CPU_FUSED=0``."""
    if os.environ.get("KVBENCH_CPU_FUSED", "1") == "0" or not fuse_supported(device, dtype):
        return False
    from kvbench.kernels.dense_op import dense_ops_unavailable

    return dense_ops_unavailable() is None


def build_model(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str, seed: int, prepack: bool | None = None,
    fuse: bool | None = None,
) -> LlamaModel:
    """Resolve and validate ``cfg``, allocate the model, fill its weights; eval mode.

    ``prepack`` (None: ``prepack_default``): the linears' weights are packed once (kvbench's own GEMM
    where its op library builds, else oneDNN's), so eager decode steps run packed GEMMs, as a CPU
    serving engine does (LlamaModel.prepack). It costs milliseconds here, and a second copy of the
    linear weights in host memory. ``fuse`` (None:
    ``fuse_default``): eager forwards run the element-wise work between the GEMMs as fused C++ ops
    (LlamaModel.fuse_elementwise), also as a CPU serving engine does.

    On CPU, denormal floats are flushed to zero for the whole process: attention over long
    contexts makes softmax probabilities below 1e-38, and x86 arithmetic on such denormals
    is ~100x slower (a tiny-llama Poisson run took 101 s instead of 3.7 s). GPUs flush them
    in their fast paths too; every impl runs under the same setting, so token parity holds.
    """
    if torch.device(device).type == "cpu":
        torch.set_flush_denormal(True)
    cfg = resolve_model_config(cfg)
    refusal = compute_refusal(cfg)
    if refusal is not None:
        raise ConfigError(refusal)
    model = model_class(cfg.architecture)(cfg, dtype, device)
    with torch.no_grad():
        if cfg.weights == "path":
            assert cfg.path is not None  # validated
            load_safetensors_weights(model, cfg.path)
        else:
            init_dummy_weights(model, seed)
    model = model.eval().requires_grad_(False)
    if prepack_default(device, dtype) if prepack is None else prepack:
        model.prepack()
    if fuse_default(device, dtype) if fuse is None else fuse:
        model.fuse_elementwise()
    return model
