"""Gated DeltaNet (harness/model/gated_delta.py) against transformers' own functions and layer: the delta rule token
by token with its state carried equals one pass, and equals transformers' recurrent and chunked forms on random
inputs of awkward sizes; the causal convolution carried in pieces equals one pass; the whole layer equals
transformers' Qwen3NextGatedDeltaNet; and each comparison can fail (a state dropped between pieces)."""

from __future__ import annotations

import pytest
import torch

from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.gated_delta import GatedDeltaNet, causal_conv, chunked_gated_delta_rule, gated_delta_rule
from kvbench.impls.base import StateRows

qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

# 2 sequences of 37 tokens, 3 key heads each serving 2 value heads, key size 5, value size 7
N, L, HK, HV, DK, DV = 2, 37, 3, 6, 5, 7


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(N, L, HK, DK, generator=gen) for _ in range(2))
    v = torch.randn(N, L, HV, DV, generator=gen)
    g = -torch.rand(N, L, HV, generator=gen)  # log decays: <= 0
    beta = torch.rand(N, L, HV, generator=gen)
    state = torch.randn(N, HV, DK, DV, generator=gen)
    return q, k, v, g, beta, state


def _pieces(cuts, state, q, k, v, g, beta, carry: bool = True):
    outs, s = [], state
    for a, b in zip((0, *cuts), (*cuts, L)):
        out, s_next = gated_delta_rule(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], s)
        outs.append(out)
        s = s_next if carry else state
    return torch.cat(outs, dim=1), s


def test_carried_state_token_by_token_equals_one_pass():
    q, k, v, g, beta, state = _inputs()
    whole, final = gated_delta_rule(q, k, v, g, beta, state)
    cut, cut_final = _pieces(list(range(1, L)), state, q, k, v, g, beta)
    torch.testing.assert_close(cut, whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cut_final, final, rtol=1e-5, atol=1e-5)


def test_a_state_dropped_between_pieces_differs():
    q, k, v, g, beta, state = _inputs()
    whole, _ = gated_delta_rule(q, k, v, g, beta, state)
    dropped, _ = _pieces([16], state, q, k, v, g, beta, carry=False)
    assert (dropped[:, 16:] - whole[:, 16:]).abs().max() > 1e-2
    torch.testing.assert_close(dropped[:, :16], whole[:, :16])


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_the_chunked_form_equals_token_by_token(chunk):
    """Chunks that divide L (37) and do not, and one longer than it."""
    q, k, v, g, beta, state = _inputs(3)
    want, want_state = gated_delta_rule(q, k, v, g, beta, state)
    got, got_state = chunked_gated_delta_rule(q, k, v, g, beta, state, chunk)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_state, want_state, rtol=1e-5, atol=1e-5)
    other, _ = chunked_gated_delta_rule(q, k, v, g.flip(1), beta, state, chunk)  # the decays in another order
    assert (other - want).abs().max() > 1e-2


@pytest.mark.parametrize("rule", [gated_delta_rule, chunked_gated_delta_rule])
@pytest.mark.parametrize("form", ["torch_recurrent_gated_delta_rule", "torch_chunk_gated_delta_rule"])
def test_equals_transformers(form, rule):
    q, k, v, g, beta, state = _inputs(1)
    ref = getattr(qwen3_next, form)  # the torch fallback on a CPU (no flash-linear-attention kernels)
    want, want_state = ref(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                           use_qk_l2norm_in_kernel=True)
    got, got_state = rule(q, k, v, g, beta, state)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_state, want_state, rtol=1e-4, atol=1e-4)
    # and not from any state: transformers' from zeros is another answer
    zero, _ = ref(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert (zero - got).abs().max() > 1e-2


def test_causal_conv_in_pieces_equals_transformers_whole():
    gen = torch.Generator().manual_seed(2)
    x, weight = torch.randn(N, L, 11, generator=gen), torch.randn(11, 4, generator=gen)
    want = qwen3_next.causal_conv1d_fn(x.transpose(1, 2), weight, None, activation="silu").transpose(1, 2)
    state = torch.zeros(N, 11, 3)
    outs = []
    for a, b in ((0, 2), (2, 3), (3, 20), (20, L)):  # pieces shorter than the kernel too
        out, state = causal_conv(x[:, a:b], state, weight)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=1), want)
    torch.testing.assert_close(state, x[:, -3:].transpose(1, 2))
    restarted, _ = causal_conv(x[:, 20:], torch.zeros(N, 11, 3), weight)
    assert (restarted - want[:, 20:]).abs().max() > 1e-3  # the state matters


class _Rows:
    """A cache's StateRows for one sequence at a time, its state kept here between calls."""

    def __init__(self, capacity: int) -> None:
        self.flat = torch.zeros(1, capacity)

    def rows(self, length: int) -> StateRows:
        def write(rows: torch.Tensor) -> None:
            self.flat = torch.nn.functional.pad(rows, (0, self.flat.shape[1] - rows.shape[1]))

        return StateRows((length,), self.flat.shape[1], lambda: self.flat.clone(), write)


def test_the_layer_in_pieces_equals_transformers_layer_whole():
    """transformers' Qwen3NextGatedDeltaNet over 29 tokens at once; ours over pieces of 11, 1, 1 and 16 tokens, its
    state carried by the cache's interface (with room to spare past the state)."""
    import transformers

    hf_cfg = transformers.Qwen3NextConfig(hidden_size=32, num_hidden_layers=1, linear_num_key_heads=2,
                                          linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                                          linear_conv_kernel_dim=4, rms_norm_eps=1e-6)
    torch.manual_seed(4)
    hf = qwen3_next.Qwen3NextGatedDeltaNet(hf_cfg, 0).float().eval()
    cfg = ModelConfig(hidden_size=32, rms_norm_eps=1e-6, linear_num_key_heads=2, linear_num_value_heads=4,
                      linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4)
    ours = GatedDeltaNet(cfg, torch.float32, "cpu")
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.normal_(0.0, 0.5 if p.dim() > 1 else 0.3)
        for name, p in ours.named_parameters():
            p.copy_(dict(hf.named_parameters())[name])
    x = torch.randn(1, 29, 32)
    with torch.no_grad():
        want = hf(x)[0]
        cache = _Rows(ours.state_values + 5)
        got = torch.cat([ours(x[0, a:b], cache.rows(b - a)) for a, b in ((0, 11), (11, 12), (12, 13), (13, 29))])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        fresh = _Rows(ours.state_values)
        forgot = ours(x[0, 13:], fresh.rows(16))  # the last piece from a zero state: another answer
    assert (forgot - want[13:]).abs().max() > 1e-3
