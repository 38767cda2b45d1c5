"""What the simulated clock needs of a model (harness/serving/cost_model.py prices a step from it), in plain numbers.

Beside the weights, the KV bytes a token and the layers' kinds (harness/serving/layer_terms.py), two figures price
the caches that are not K and V per head (harness/kv/latent.py):

- ``attn_flops_per_token``: the FLOPs decode attention spends on each KV token it reads, over every caching layer.
  Ordinary attention: 2 x heads x (head_dim for q.k + head_dim for p.v); with grouped queries each K/V byte feeds
  ``heads / kv_heads`` query heads, about 8-16 FLOPs a byte at bf16, far below any GPU's ridge (memory-bound at
  every batch). MLA in the absorbed form (harness/model/deepseek.py, FlashMLA's): every one of the ``heads`` query
  heads multiplies the one stored latent row, 2 x heads x ((kv_lora_rank + qk_rope_head_dim) + kv_lora_rank)
  FLOPs for ``kv_lora_rank + qk_rope_head_dim`` values read: DeepSeek-V3, 128 heads, 278,528 FLOPs for 1,152
  bytes in bf16, 242 FLOPs a byte (484 at fp8), at or past an H100's or H200's ridge: its decode attention is
  compute-bound where GQA's is memory-bound, whatever the batch (FlashMLA reports 660 TFLOPS compute-bound decode
  on an H800 SXM5, 67% of its dense peak).
- ``prefill_flops_per_pair``: a prompt's attention, per (query, key) pair over every caching layer (roofline
  version 10): q.k and p.v of every query head, ``2 x heads x (qk_dim + v_dim)``. MLA's prefill runs the
  un-absorbed form (vLLM's and SGLang's MLA backends: the latent expanded to per-head K and V), qk_dim
  ``qk_nope_head_dim + qk_rope_head_dim`` and v_dim ``v_head_dim`` (DeepSeek-V3: 2 x 128 x (192 + 128)); GQA's
  is ``attn_flops_per_token``.
- ``state_bytes_per_seq``: a linear-attention layer (Qwen3-Next's Gated DeltaNet) reads and rewrites its sequence's
  whole recurrent and convolution state every decode step: 2 x that many bytes a sequence and step.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.harness.kv import latent
from kvbench.harness.kv.sizes import (
    DTYPE_BYTES, WEIGHT_DTYPE_BYTES, embedding_parameters, expert_matrix_parameters, kv_bytes_per_token,
    parameter_count, state_bytes_per_seq, stored_weight_bytes, weight_bytes,
)
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.serving.layer_terms import Experts, WindowShare, window_shares


@dataclass(frozen=True)
class ModelCost:
    """What the clock needs of a model (harness/kv/sizes.py computes these from its shape)."""

    params: int  # every parameter (an untied LM head and the embedding table both counted)
    weight_bytes: int  # W: what one step streams (an untied embedding table is a lookup, not read)
    kv_bytes_per_token: int
    num_layers: int
    hidden_size: int
    elem_bytes: int  # activations' dtype
    windows: tuple[WindowShare, ...] = ()  # sliding layers' share of the KV, per window (none: all full)
    experts: Experts = Experts()  # routed experts (none: a dense model)
    head_params: int = 0  # H: the LM head (vocab x hidden), the embedding table's shape (0: none counted apart)
    tied_head: bool = False  # the LM head is the embedding table (``params`` counts it once)
    fp8: bool = False  # weights at fp8: the matmuls run at the GPU's fp8 peak where it has one
    attn_flops_per_token: int = 0  # decode attention's FLOPs per KV token read, every caching layer (module doc)
    state_bytes_per_seq: int = 0  # a sequence's fixed state over its linear-attention layers (module doc)
    prefill_flops_per_pair: int = 0  # a prompt's attention FLOPs a (query, key) pair, every caching layer

    @property
    def active_params(self) -> int:
        """P: parameters each token multiplies by (a mixture's dense part and k experts), less the embedding table
        (a lookup) and the LM head (computed per row of logits: ``head_params``)."""
        tables = self.head_params * (1 if self.tied_head else 2)
        return self.params - self.experts.inactive_params - tables

    def flops(self, tokens: int, logits_rows: int) -> float:
        """2*P a token and 2*H a row of logits."""
        return 2.0 * (self.active_params * tokens + self.head_params * logits_rows)


def attention_flops_per_token(model: ModelConfig) -> int:
    """Decode attention's FLOPs per KV token read, over every caching layer: q.k and p.v of every query head."""
    if latent.is_latent(model):  # absorbed MLA: each head against the one latent row; p.v over the latent part
        per_head = latent.latent_values_per_token(model) + model.kv_lora_rank
    else:
        per_head = 2 * model.head_dim
    return latent.cached_layers(model) * 2 * model.num_heads * per_head


def prefill_attention_flops_per_pair(model: ModelConfig) -> int:
    """A prompt's attention FLOPs per (query, key) pair, over every caching layer (MLA: the un-absorbed form)."""
    if not latent.is_latent(model):  # GQA: the same q.k and p.v as a decode step's, per key
        return attention_flops_per_token(model)
    per_head = model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim
    return latent.cached_layers(model) * 2 * model.num_heads * per_head


def model_cost(model: ModelConfig, dtype: str, kv_dtype: str = "auto", kv_scale: str = "tensor",
               weight_dtype: str = "auto") -> ModelCost:
    """A model config's figures for ``dtype``, its KV cache stored as ``kv_dtype`` and its weights as ``weight_dtype``
    (harness/kv/sizes.py): a step streams every stored weight but an untied embedding table."""
    stored = stored_weight_bytes(model, dtype, weight_dtype)
    table = embedding_parameters(model)
    streamed = stored - (0 if model.tie_word_embeddings else table * DTYPE_BYTES[dtype])
    matrices = dtype if weight_dtype == "auto" else weight_dtype
    return ModelCost(params=parameter_count(model), weight_bytes=streamed,
                     kv_bytes_per_token=kv_bytes_per_token(model, dtype, kv_dtype, kv_scale),
                     num_layers=model.num_layers,
                     hidden_size=model.hidden_size, elem_bytes=DTYPE_BYTES[dtype],
                     windows=window_shares(model.layer_types, model.sliding_window),
                     experts=_experts(model, matrices), head_params=table, tied_head=model.tie_word_embeddings,
                     fp8=matrices == "fp8", attn_flops_per_token=attention_flops_per_token(model),
                     state_bytes_per_seq=state_bytes_per_seq(model, dtype),
                     prefill_flops_per_pair=prefill_attention_flops_per_pair(model))


def _experts(model: ModelConfig, dtype: str) -> Experts:
    """A mixture's routed experts as stored at ``dtype`` (MXFP4 experts at their packed size); none for a dense
    model."""
    if not model.is_moe:
        return Experts()
    matrix = expert_matrix_parameters(model)  # one layer's, every expert
    stored = (weight_bytes(model, dtype)
              - (parameter_count(model) - model.num_layers * matrix) * WEIGHT_DTYPE_BYTES[dtype])
    return Experts(layers=model.num_layers, count=model.num_experts, per_token=model.num_experts_per_tok,
                   expert_bytes=round(stored / (model.num_layers * model.num_experts)),
                   expert_params=matrix // model.num_experts, width=model.moe_intermediate_size)
