"""Qwen3-Next's Gated DeltaNet (its ``linear_attention`` layers), as transformers 5 computes it
(models/qwen3_next/modeling_qwen3_next.py, ``Qwen3NextGatedDeltaNet``), with its state held by the KV cache.

A layer projects each token to q, k, v (``in_proj_qkvz``, which also gives the output gate z) and to the write
strength b and the decay's input a (``in_proj_ba``), both laid out per key head as transformers splits them. q, k
and v then pass a causal depthwise convolution of ``linear_conv_kernel_dim`` taps (SiLU after it), whose state is
the last ``kernel - 1`` inputs. The gated delta rule then runs over the tokens, per value head, on a recurrent
state ``S [key_head_dim, value_head_dim]``, in float32 (``gated_delta_rule``)::

    S = S * exp(g_t);  S = S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t

with ``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``, q and k L2-normed and q scaled by
``key_head_dim ** -0.5``; a key head serves ``num_v_heads / num_k_heads`` consecutive value heads. The output is
RMS-normed per value head, times ``silu(z)`` (``GatedRMSNorm``), and projected back (``out_proj``).

A decode step runs the rule token by token (``gated_delta_rule``), a prompt's chunk in chunks of 64 tokens
(``chunked_gated_delta_rule``: the same sums in another order, as transformers' prefill does; fp32 results agree
to rounding, tests/unit/harness/model/test_gated_delta.py). The state of each
sequence is the cache's (impls/base.py ``StateRows``): one flat row per sequence, the recurrent state's values
first, then the convolution state's, in the cache's dtype (the model's); zeros at a sequence's first write.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.llama import Device, Linear
from kvbench.impls.base import StateRows

L2_EPS = 1e-6  # transformers' l2norm (the FLA library's)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension, as transformers computes it."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def causal_conv(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The depthwise causal convolution and its SiLU over ``x [N, L, C]``, continuing from ``state [N, C, K-1]``
    (the last K-1 inputs before ``x``: zeros at a sequence's start); ``weight [C, K]``. Returns the output
    ``[N, L, C]`` in ``x``'s dtype and the new state (the last K-1 inputs, in ``state``'s dtype)."""
    taps = weight.shape[-1]
    seq = torch.cat((state.to(weight.dtype), x.transpose(1, 2).to(weight.dtype)), dim=-1)  # [N, C, K-1+L]
    out = F.conv1d(seq, weight.unsqueeze(1), groups=weight.shape[0])  # [N, C, L]
    new_state = seq[:, :, seq.shape[-1] - (taps - 1):]
    return F.silu(out).transpose(1, 2).to(x.dtype), new_state.to(state.dtype)


Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _per_value_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> Inputs:
    """float32 inputs of the rule, every one per value head: q and k repeated for the value heads their key head
    serves (consecutive ones), L2-normed (transformers' ``use_qk_l2norm_in_kernel=True``), q scaled by Dk ** -0.5."""
    groups = v.shape[2] // k.shape[2]
    if groups > 1:
        q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
    q, k = l2norm(q.float()), l2norm(k.float())
    return q / (q.shape[-1] ** 0.5), k, v.float(), g.float(), beta.float()


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token: ``q, k [N, L, Hk, Dk]``, ``v [N, L, Hv, Dv]``, ``g, beta [N, L, Hv]``,
    ``state [N, Hv, Dk, Dv]`` -> ``(out [N, L, Hv, Dv]`` in q's dtype, the final state in float32)``; everything
    runs in float32. A decode step's form (one token a sequence), and the reference of ``chunked_gated_delta_rule``."""
    dtype = q.dtype
    q, k, v, g, beta = _per_value_head(q, k, v, g, beta)
    s = state.float()
    out = torch.empty_like(v)
    for t in range(v.shape[1]):
        s = s * g[:, t].exp()[..., None, None]
        k_t = k[:, t].unsqueeze(-1)  # [N, H, Dk, 1]
        delta = (v[:, t] - (s * k_t).sum(dim=-2)) * beta[:, t].unsqueeze(-1)  # [N, H, Dv]
        s = s + k_t * delta.unsqueeze(-2)
        out[:, t] = (s * q[:, t].unsqueeze(-1)).sum(dim=-2)
    return out.to(dtype), s


def chunked_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, state: torch.Tensor, chunk: int = 64) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """``gated_delta_rule``'s sums, ``chunk`` tokens at a time (a prompt's form: L / chunk steps, not L).

    In a chunk from state S0, with ``G_t = exp(g_1 + ... + g_t)`` and ``delta_s`` the rule's write of token s
    (``S_t = G_t S0 + sum_{s <= t} (G_t / G_s) k_s delta_s^T``), each write depends on the earlier ones of its
    chunk through ``(I + diag(beta) (D o K K^T)) Delta = diag(beta) (V - diag(G) K S0)``, D the strictly lower
    decays ``G_t / G_s``: one unit-lower-triangular solve. Then ``O = diag(G) Q S0 + (D' o Q K^T) Delta`` (D' with
    its diagonal) and ``S_C = G_C S0 + (K o G_C / G)^T Delta``."""
    dtype = q.dtype
    q, k, v, g, beta = (x.transpose(1, 2) for x in _per_value_head(q, k, v, g, beta))  # [N, H, L, ...]
    s = state.float()
    out = torch.empty_like(v)
    for a in range(0, v.shape[2], chunk):
        b = min(a + chunk, v.shape[2])
        qc, kc, vc, bc = q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], beta[:, :, a:b, None]
        logs = g[:, :, a:b].cumsum(-1)  # log G_t, [N, H, C]
        causal = torch.ones(b - a, b - a, dtype=torch.bool, device=v.device).tril()
        # G_t / G_s where s <= t (a masked exponent: exp(-inf) = 0, no overflow above the diagonal)
        decays = torch.where(causal, logs[..., :, None] - logs[..., None, :], float("-inf")).exp()
        system = torch.eye(b - a, device=v.device) + bc * (decays.tril(-1) * (kc @ kc.transpose(-1, -2)))
        grown = logs.exp()[..., None]
        writes = torch.linalg.solve_triangular(system, bc * (vc - grown * (kc @ s)), upper=False, unitriangular=True)
        out[:, :, a:b] = grown * (qc @ s) + (decays * (qc @ kc.transpose(-1, -2))) @ writes
        s = grown[..., -1:, :] * s + (kc * (logs[..., -1:] - logs).exp()[..., None]).transpose(-1, -2) @ writes
    return out.transpose(1, 2).to(dtype), s


class GatedRMSNorm(nn.Module):
    """transformers' Qwen3NextRMSNormGated: RMS-normed in float32, cast back, times the (plain) weight, times
    ``silu(gate)`` in float32, cast back."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, dtype=dtype, device=device))  # filled by build_model
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (normed * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """One ``linear_attention`` layer; parameter names as transformers' ``linear_attn.*``."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: Device) -> None:
        super().__init__()
        self.k_heads, self.v_heads = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.k_dim, self.v_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.taps = cfg.linear_conv_kernel_dim
        self.key_size, self.value_size = self.k_heads * self.k_dim, self.v_heads * self.v_dim
        self.channels = 2 * self.key_size + self.value_size
        hidden = cfg.hidden_size
        self.in_proj_qkvz = Linear(hidden, 2 * self.key_size + 2 * self.value_size, False, dtype, device)
        self.in_proj_ba = Linear(hidden, 2 * self.v_heads, False, dtype, device)
        self.conv1d = nn.Module()  # transformers' nn.Conv1d holds ``conv1d.weight [C, 1, K]``, no bias
        self.conv1d.weight = nn.Parameter(torch.empty(self.channels, 1, self.taps, dtype=dtype, device=device))
        self.dt_bias = nn.Parameter(torch.empty(self.v_heads, dtype=dtype, device=device))
        self.A_log = nn.Parameter(torch.empty(self.v_heads, dtype=dtype, device=device))
        self.norm = GatedRMSNorm(self.v_dim, cfg.rms_norm_eps, dtype, device)
        self.out_proj = Linear(self.value_size, hidden, False, dtype, device)

    @property
    def state_values(self) -> int:
        """One sequence's state in this layer, in values: the recurrent state's, then the convolution state's
        (harness/kv/latent.py ``state_values_per_layer`` sizes the same)."""
        return self.v_heads * self.k_dim * self.v_dim + self.channels * (self.taps - 1)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [T, hidden]`` -> the convolution's input ``[T, C]`` (q, k, v), z ``[T, Hv, Dv]``, b and a ``[T, Hv]``:
        transformers' ``fix_query_key_value_ordering`` (each key head's q, k, its value heads' v and z, in turn)."""
        tokens, per = x.shape[0], self.v_heads // self.k_heads
        qkvz = self.in_proj_qkvz(x).view(tokens, self.k_heads, 2 * self.k_dim + 2 * per * self.v_dim)
        q, k, v, z = qkvz.split([self.k_dim, self.k_dim, per * self.v_dim, per * self.v_dim], dim=-1)
        b, a = self.in_proj_ba(x).view(tokens, self.k_heads, 2 * per).split([per, per], dim=-1)
        mixed = torch.cat((q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1)), dim=-1)
        return (mixed, z.reshape(tokens, self.v_heads, self.v_dim), b.reshape(tokens, self.v_heads),
                a.reshape(tokens, self.v_heads))

    def unpack(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A step's state rows ``[N, >= state_values]`` -> recurrent ``[N, Hv, Dk, Dv]`` and conv ``[N, C, K-1]``."""
        if flat.shape[-1] < self.state_values:
            raise ValueError(f"the cache's state rows hold {flat.shape[-1]} values a sequence; this layer's state is "
                             f"{self.state_values} (recurrent and convolution)")
        n, rec = flat.shape[0], self.v_heads * self.k_dim * self.v_dim
        return (flat[:, :rec].reshape(n, self.v_heads, self.k_dim, self.v_dim),
                flat[:, rec:self.state_values].reshape(n, self.channels, self.taps - 1))

    def mix(self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, conv_state: torch.Tensor,
            rec_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """N sequences of L tokens each (``mixed [N, L, C]``, ``b, a [N, L, Hv]``): the convolution and the delta
        rule from their states; returns the output ``[N, L, Hv, Dv]`` and both new states."""
        n, length = mixed.shape[:2]
        conv_out, conv_state = causal_conv(mixed, conv_state, self.conv1d.weight.squeeze(1))
        q, k, v = conv_out.split([self.key_size, self.key_size, self.value_size], dim=-1)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        rule = gated_delta_rule if length == 1 else chunked_gated_delta_rule  # as transformers: decode, prefill
        out, rec = rule(q.reshape(n, length, self.k_heads, self.k_dim),
                                    k.reshape(n, length, self.k_heads, self.k_dim),
                                    v.reshape(n, length, self.v_heads, self.v_dim), g, b.sigmoid(), rec_state)
        return out.to(mixed.dtype), conv_state, rec

    def forward(self, x: torch.Tensor, states: StateRows) -> torch.Tensor:
        """``x [T, hidden]`` (the step's sequences' rows, in ``states.lengths``' order) -> ``[T, hidden]``; reads
        each sequence's state from the cache and writes the new one back."""
        mixed, z, b, a = self.split(x)
        rec_state, conv_state = self.unpack(states.read())
        lengths = states.lengths
        if all(n == 1 for n in lengths):  # a decode batch: every sequence at once
            out, conv_new, rec_new = self.mix(mixed[:, None], b[:, None], a[:, None], conv_state, rec_state)
        else:  # sequence by sequence
            outs, convs, recs, first = [], [], [], 0
            for i, n in enumerate(lengths):
                rows = slice(first, first + n)
                o, c, r = self.mix(mixed[None, rows], b[None, rows], a[None, rows], conv_state[i:i + 1],
                                   rec_state[i:i + 1])
                outs.append(o[0])
                convs.append(c)
                recs.append(r)
                first += n
            out, conv_new, rec_new = torch.cat(outs), torch.cat(convs), torch.cat(recs)
        store = rec_state.dtype
        states.write(torch.cat((rec_new.to(store).flatten(1), conv_new.to(store).flatten(1)), dim=1))
        out = self.norm(out.reshape(-1, self.v_dim), z.reshape(-1, self.v_dim)).view(x.shape[0], self.value_size)
        return self.out_proj(out)
