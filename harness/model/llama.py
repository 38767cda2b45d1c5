"""The Llama family (Llama 2/3, Mistral, Qwen2, Qwen3) as one plain-torch decoder.

Inputs are flat token batches (vLLM style): ``T`` tokens that may belong to many
sequences. The model knows nothing about sequences; the attention callable (a KV
cache) stores K/V and decides what each query attends to.

Differences inside the family are config switches: GQA (``num_kv_heads``), q/k/v
bias (Qwen2, and Llama's and Qwen3's ``attention_bias``), Qwen3's per-head q/k norms,
tied embeddings, and Llama-3.1 RoPE scaling. Every layer attends to the whole prefix:
a sliding window (Mistral v0.1, Qwen2/3 with use_sliding_window) is computed only where
it hides nothing, a window at least the run's max_seq_len (harness/model/support.py
refuses the rest, and the families this decoder does not compute).

On a CPU at float32 (build_model's defaults) the eager forward runs the dense work as a CPU serving
engine does: decode-sized GEMMs on weights packed once (harness/model/packed_linear.py), and the
element-wise work between them as fused C++ ops (``fuse_elementwise``, kernels/dense_op.py). Torch's
op-at-a-time path stays the reference, and the path of every other device and dtype.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.packed_linear import (  # noqa: F401  (the packed GEMMs' names, as the tests know them)
    PACKED_MAX_ROWS,
    PackedWeight,
    linear,
    pack_kind,
    prepack_supported,
)
from kvbench.harness.model.rope import RotaryEmbedding, apply_rotary
from kvbench.kernels import dense_op

# (layer_idx, q [T, heads, head_dim], k [T, kv_heads, head_dim], v [T, kv_heads, head_dim])
#   -> [T, heads, head_dim]. q and k carry RoPE already; the callee applies the
#   softmax scale (head_dim ** -0.5, or the model's: ModelConfig.softmax_scale). q, k and v are contiguous.
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

Device = torch.device | str


def has_o_bias(cfg: ModelConfig) -> bool:
    """HF Llama's (and Qwen3's) ``attention_bias`` also biases o_proj; Qwen2's bias is q/k/v only."""
    return cfg.o_bias


def _empty(*shape: int, dtype: torch.dtype, device: Device) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device))


def fuse_supported(device: Device, dtype: torch.dtype) -> bool:
    """Whether LlamaModel.fuse_elementwise applies: float32 on a CPU (its C++ ops take float32 rows)."""
    return torch.device(device).type == "cpu" and dtype == torch.float32


def fused_here(x: torch.Tensor, fused: bool) -> bool:
    """Whether an eager forward runs a module's fused C++ element-wise op on ``x`` (``fuse_elementwise``):
    the model fused, float32 rows on a CPU, contiguous, and no graph being traced (a compiled graph traces
    torch's ops, which inductor fuses itself)."""
    return (fused and x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous()
            and not torch.compiler.is_compiling())


class Linear(nn.Module):
    """``nn.Linear`` (same parameters, same order), allocated and never initialised.

    build_model fills every weight (dummy or checkpoint), so nn.Linear's kaiming init of
    a 70B model would be wasted work; ``skip_init``, which avoids it by building on the
    meta device, costs about a second on its first call (the meta device loads sympy
    and torch._dynamo).
    """

    def __init__(self, n_in: int, n_out: int, bias: bool, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.weight = _empty(n_out, n_in, dtype=dtype, device=device)
        self.bias = _empty(n_out, dtype=dtype, device=device) if bias else None
        self.packed: PackedWeight | None = None  # LlamaModel.prepack

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)


class RMSNorm(nn.Module):
    """HF's LlamaRMSNorm: statistics in fp32, cast back before the weight multiply."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.weight = _empty(size, dtype=dtype, device=device)
        self.eps = eps
        self.fused = False  # LlamaModel.fuse_elementwise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_here(x, self.fused):
            return dense_op.rms_norm(x, self.weight, self.eps)
        return self.reference(x)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """torch's ops over the last dimension of ``x`` (any leading shape: Qwen3's per-head q/k norms)."""
        x32 = x.float()
        # HF's x32 * rsqrt(mean(x32^2) + eps), op for op; the [T, 1] statistics updated in place, which
        # saves two allocations per norm (17 norms a step in a small model's eager decode).
        var = x32.pow(2).mean(-1, keepdim=True)
        var += self.eps
        return self.weight * (x32 * var.rsqrt_()).to(x.dtype)


class Attention(nn.Module):
    """Fused q/k/v projection (one GEMM) and RoPE before the cache's attention, o_proj after it."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.qkv_proj = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, cfg.qkv_bias, dtype, device)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, has_o_bias(cfg), dtype, device)
        # Qwen3: each q and k head RMS-normed over head_dim before RoPE (HF's q_norm / k_norm).
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device) if cfg.qk_norm else None
        self.fused = False  # LlamaModel.fuse_elementwise

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> QKV:
        """What the cache's attention takes: q and k with RoPE applied, v; each dense ``[T, heads, D]``."""
        return self.split_rotate(self.qkv_proj(x), cos, sin)

    def split_rotate(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> QKV:
        """The fused projection's output ``[T, (H + 2 KVH) D]`` -> q and k rotated by RoPE, and v."""
        tokens = qkv.shape[0]
        if self.q_norm is not None and self.k_norm is not None:
            return self.split_norm_rotate(qkv, cos, sin)
        if fused_here(qkv, self.fused) and cos.is_contiguous() and sin.is_contiguous():
            return dense_op.rope_qkv(qkv, cos, sin, self.num_heads, self.num_kv_heads)  # bit-identical to below
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        # q's and k's heads rotate in one pass (per element the same arithmetic as one at a time):
        # RoPE's five element-wise kernels run once a layer rather than twice.
        qk = apply_rotary(qk.view(tokens, self.num_heads + self.num_kv_heads, self.head_dim), cos, sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        # q, k and v are strided views (of the rotated heads, of the fused output); kernels want dense rows.
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim).contiguous()
        return q.contiguous(), k.contiguous(), v

    def split_norm_rotate(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> QKV:
        """split_rotate with Qwen3's per-head q/k norms between the split and RoPE, in HF's op order (torch's
        ops: the fused rope_qkv op has no norm inside)."""
        assert self.q_norm is not None and self.k_norm is not None
        tokens = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rotary(self.q_norm.reference(q.reshape(tokens, self.num_heads, self.head_dim)), cos, sin)
        k = apply_rotary(self.k_norm.reference(k.reshape(tokens, self.num_kv_heads, self.head_dim)), cos, sin)
        return q.contiguous(), k.contiguous(), v.reshape(tokens, self.num_kv_heads, self.head_dim).contiguous()

    def project_out(self, attn: torch.Tensor) -> torch.Tensor:
        """``[T, heads, D]`` attention output -> ``[T, hidden]``."""
        return self.o_proj(attn.reshape(attn.shape[0], self.q_size))


class MLP(nn.Module):
    """SwiGLU with gate and up fused into one GEMM: ``down(silu(gate) * up)``."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, False, dtype, device)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, False, dtype, device)
        self.fused = False  # LlamaModel.fuse_elementwise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activate(self.gate_up_proj(x)))

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of the fused projection's ``[T, 2 I]`` output."""
        if fused_here(gate_up, self.fused):
            return dense_op.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = Attention(cfg, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        if cfg.is_moe:
            from kvbench.harness.model.moe import SparseMoE  # it builds on this module's Linear

            self.mlp: nn.Module = SparseMoE(cfg, dtype, device)
        else:
            self.mlp = MLP(cfg, dtype, device)

    # A layer is two halves around the cache's attention, so a decode forward can run the
    # dense work between two attentions as one piece (harness/model/piecewise.py).
    def before_attention(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> QKV:
        return self.self_attn.qkv(self.input_layernorm(h), cos, sin)

    def after_attention(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h, normed = self.add_norm(h, self.self_attn.project_out(attn))
        return h + self.mlp(normed)

    def add_norm(self, h: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream after attention, ``h + delta``, and its post-attention norm."""
        norm = self.post_attention_layernorm
        if fused_here(h, norm.fused) and delta.is_contiguous():
            return dense_op.add_rms_norm(h, delta, norm.weight, norm.eps)  # the add, then HF's norm of it
        # Same add/norm order as HF so fp32 results match it.
        h = h + delta
        return h, norm(h)

    def forward(
        self,
        layer_idx: int,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attention: AttentionFn,
    ) -> torch.Tensor:
        return self.after_attention(h, attention(layer_idx, *self.before_attention(h, cos, sin)))


class LlamaModel(nn.Module):
    """Decoder + lm_head. Parameters are allocated, not initialised: use ``build_model``.

    Parameter names follow HF's ``LlamaForCausalLM`` minus the ``model.`` prefix,
    except the fused ``qkv_proj`` and ``gate_up_proj``.
    """

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.cfg = cfg
        # An nn.Embedding over an allocated, uninitialised matrix (as Linear, for the same reason).
        self.embed_tokens = nn.Embedding.from_pretrained(
            torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype, device=device), freeze=True
        )
        self.layers = nn.ModuleList(self.make_layer(cfg, i, dtype, device) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        # Tied: the logits reuse the embedding matrix (no second copy in memory).
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else Linear(cfg.hidden_size, cfg.vocab_size, False, dtype, device)
        )
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, device)
        self.head_packed: PackedWeight | None = None  # the logits' weight packed (prepack), tied or not
        self.requires_grad_(False)

    def make_layer(self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype, device: Device) -> DecoderLayer:
        """Decoder layer ``layer_idx``: a family's own module (harness/model/families.py) overrides it, so its
        layers are built once, as its own kind."""
        return DecoderLayer(cfg, dtype, device)

    def layer_sinks(self) -> list[torch.Tensor] | None:
        """Each layer's learned attention sinks (float32 ``[num_heads]``, gpt-oss), for the cache that attends
        for it (``KVCache.set_layer_sinks``); None: no layer has any."""
        return None

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def num_parameter_bytes(self) -> int:
        """Bytes of all weights (a tied lm_head counted once)."""
        return sum(p.numel() * p.element_size() for p in self.parameters())

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionFn,
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Flat batch ``input_ids, positions [T]`` -> float32 logits.

        ``logits_indices`` picks the rows that need logits (e.g. each sequence's
        last prompt token), so prefill skips the vocab GEMM for the rest.
        Returns ``[len(logits_indices) or T, vocab_size]``.
        """
        h, cos, sin = self.embed(input_ids, positions)
        for layer_idx, layer in enumerate(self.layers):
            h = layer(layer_idx, h, cos, sin, attention)
        if logits_indices is not None:
            h = h[logits_indices]
        return self.logits(h)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first hidden states and the RoPE cos/sin every layer shares."""
        h = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, h.dtype)
        return h, cos, sin

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and the vocab projection, as float32."""
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return linear(self.norm(h), head, None, self.head_packed).float()

    def greedy(self, logits: torch.Tensor) -> list[int]:
        """Each row's greedy token, ``logits.argmax(-1)``: on a fused model's CPU float32 logits by
        kernels/dense_op.py's ``argmax_rows`` (the same indices; torch's argmax compares one element at
        a time: 0.2 ms of an 8 x 32000 step, 0.85 ms at 32 rows)."""
        if fused_here(logits, self.fused) and logits.dim() == 2:
            return dense_op.argmax_rows(logits).tolist()
        return logits.argmax(dim=-1).tolist()

    @property
    def packed(self) -> bool:
        """Whether eager decode-sized GEMMs run on pre-packed weights (``prepack``; which kernel: ``packed_kind``)."""
        return self.head_packed is not None

    @property
    def packed_kind(self) -> str | None:
        """The packed GEMMs' kernel (harness/model/packed_linear.py): kvbench, onednn, or None unpacked."""
        return None if self.head_packed is None else self.head_packed.kind

    def gemm_row_breaks(self) -> tuple[int, ...]:
        """The row counts on either side of which an eager forward's dense GEMMs run another kernel: a
        step's cost jumps there (kvbench's packed GEMM runs 1-64 rows, oneDNN's 2-64, MKL's sgemm the rest;
        measured on the 2-core CPU with oneDNN: 64-token prefills cost 0.11 ms a token, 65-128 token ones
        about 0.13). A profile measures both sides of each, so that no interpolated segment spans a jump
        (harness/scenarios/profile_grid.py). Empty without packed weights: one kernel family."""
        if self.head_packed is None:
            return ()
        low = self.head_packed.min_rows
        return ((low - 1, low) if low > 1 else ()) + (PACKED_MAX_ROWS, PACKED_MAX_ROWS + 1)

    def prepack(self, kind: str | None = None) -> int:
        """Pack every linear's weight (and the logits') once for ``kind``'s GEMM (None: ``pack_kind()``,
        kvbench's own where its op library loads, else oneDNN's; ``prepack_supported``); returns the
        bytes of the packed copies, which sit beside the plain weights."""
        if not prepack_supported(self.device, self.dtype):
            raise ValueError(f"prepack needs float32 on a CPU with oneDNN; the model is {self.dtype} on {self.device}")
        kind = kind or pack_kind()
        nbytes = 0
        for module in self.modules():
            if isinstance(module, Linear) and module is not self.lm_head:
                module.packed = PackedWeight(module.weight, kind)
                nbytes += module.weight.numel() * module.weight.element_size()
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        self.head_packed = PackedWeight(head, kind)
        return nbytes + head.numel() * head.element_size()

    @property
    def fused(self) -> bool:
        """Whether eager forwards run the fused C++ element-wise ops (``fuse_elementwise``)."""
        return self.norm.fused

    def fuse_elementwise(self, on: bool = True) -> None:
        """Run the element-wise work between the GEMMs (RMSNorm, the residual add before a norm, RoPE with
        the q/k/v split, SiLU times up) as kernels/dense_op.py's fused C++ ops in eager forwards: one call
        each where torch runs ~25 small ops a layer. float32 on a CPU; needs the op library (a C++
        compiler builds it once). ``on=False`` goes back to torch's ops."""
        if on:
            if not fuse_supported(self.device, self.dtype):
                raise ValueError(f"the fused element-wise ops need float32 on a CPU; the model is {self.dtype} "
                                 f"on {self.device}")
            dense_op.load_dense_ops()
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, MLP)):
                module.fused = on

    def unpack(self) -> None:
        """Back to F.linear everywhere (drops the packed copies)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.packed = None
        self.head_packed = None

