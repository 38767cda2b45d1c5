"""YaRN RoPE bit for bit as transformers computes it (its inverse frequencies and the attention factor on cos/sin),
and through the rotary embedding every layer shares."""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.harness.model.config import RopeScaling
from kvbench.harness.model.rope import RotaryEmbedding, inverse_frequencies
from kvbench.harness.model.rope_yarn import correction_range, yarn_attention_factor, yarn_inverse_frequencies

transformers = pytest.importorskip("transformers")

# (head_dim, theta, factor, original context, beta_fast, beta_slow, truncate): gpt-oss's own, transformers'
# truncating default, a short original context (the ramp clipped at 0), a factor of 1 (no attention factor), and
# betas that put both ends of the ramp on one dimension (transformers' zero-width guard).
CASES = [(64, 150000.0, 32.0, 4096, 32.0, 1.0, False), (64, 150000.0, 32.0, 4096, 32.0, 1.0, True),
         (128, 10000.0, 4.0, 64, 32.0, 1.0, True), (32, 500000.0, 1.0, 2048, 16.0, 2.0, False),
         (64, 10000.0, 8.0, 4096, 8.0, 8.0, False)]


def _scaling(case) -> RopeScaling:
    _, _, factor, context, fast, slow, truncate = case
    return RopeScaling(rope_type="yarn", factor=factor, original_max_position_embeddings=context, beta_fast=fast,
                       beta_slow=slow, truncate=truncate)


def _hf(case) -> tuple[torch.Tensor, float]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    head_dim, theta, factor, context, fast, slow, truncate = case
    config = transformers.GptOssConfig(
        head_dim=head_dim, num_attention_heads=4, hidden_size=64, max_position_embeddings=context * int(factor),
        rope_parameters=dict(rope_type="yarn", rope_theta=theta, factor=factor, beta_fast=fast, beta_slow=slow,
                             truncate=truncate, original_max_position_embeddings=context))
    return ROPE_INIT_FUNCTIONS["yarn"](config)


@pytest.mark.parametrize("case", CASES)
def test_inverse_frequencies_and_factor_equal_transformers_bit_for_bit(case):
    want, factor = _hf(case)
    ours = yarn_inverse_frequencies(case[0], case[1], _scaling(case))
    assert ours.dtype == torch.float32 and torch.equal(ours, want)
    assert yarn_attention_factor(_scaling(case)) == factor
    assert torch.equal(inverse_frequencies(case[0], case[1], _scaling(case)), want)  # rope.py's dispatch


def test_the_ramp_interpolates_slow_pairs_and_keeps_fast_ones():
    """The test above can fail: yarn is neither plain RoPE nor plain interpolation, and truncate moves the ramp."""
    case = CASES[0]
    scaling = _scaling(case)
    plain = inverse_frequencies(64, 150000.0, None)
    ours = yarn_inverse_frequencies(64, 150000.0, scaling)
    assert torch.equal(ours[:4], plain[:4]) and torch.allclose(ours[-4:], plain[-4:] / 32)
    low, high = correction_range(64, 150000.0, scaling)
    assert 0 < low < high < 31 and low != math.floor(low)
    truncated = correction_range(64, 150000.0, _scaling(CASES[1]))
    assert truncated == (math.floor(low), math.ceil(high))
    assert not torch.equal(yarn_inverse_frequencies(64, 150000.0, _scaling(CASES[1])), ours)


def test_cos_and_sin_carry_the_attention_factor_as_transformers_casts_them():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    case = CASES[0]
    config = transformers.GptOssConfig(
        head_dim=64, num_attention_heads=4, hidden_size=64,
        rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0,
                             truncate=False, original_max_position_embeddings=4096))
    theirs = GptOssRotaryEmbedding(config)
    ours = RotaryEmbedding(64, 150000.0, _scaling(case), "cpu")
    assert ours.attention_factor == pytest.approx(0.1 * math.log(32) + 1)
    positions = torch.tensor([0, 1, 7, 127, 1000, 131071])
    for dtype in (torch.float32, torch.bfloat16):
        cos, sin = ours(positions, dtype)
        want_cos, want_sin = theirs(torch.zeros(1, dtype=dtype), positions[None])
        # transformers keeps one half (its rotation pairs the halves); kvbench repeats it for rotate_half
        assert torch.equal(cos, torch.cat([want_cos[0]] * 2, -1)) and torch.equal(sin, torch.cat([want_sin[0]] * 2, -1))


def test_a_scaling_of_another_kind_is_refused():
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        yarn_inverse_frequencies(64, 10000.0, RopeScaling(rope_type="llama3"))
