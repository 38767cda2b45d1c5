"""kernels/sinks.py ``check_sinks``: the one check of a kernel's ``sinks`` argument, naming what it got."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.sinks import check_sinks
from kvbench.kernels.validate import KernelArgumentError


@pytest.mark.parametrize("sinks", [None, torch.zeros(4), torch.randn(4)])
def test_none_or_a_float32_vector_of_heads_passes(sinks):
    check_sinks(sinks, 4, torch.device("cpu"))


@pytest.mark.parametrize("sinks,match", [
    (torch.zeros(5), "float32 \\[num_heads=4\\], got torch.float32 \\(5,\\)"),
    (torch.zeros(1, 4), "got torch.float32 \\(1, 4\\)"),
    (torch.zeros(4, dtype=torch.float64), "got torch.float64 \\(4,\\)"),
    (torch.zeros(8)[::2], "contiguous float32"),
    (0.5, "sinks must be a float32 tensor \\[num_heads=4\\] or None, got 0.5"),
])
def test_anything_else_is_refused_by_name(sinks, match):
    with pytest.raises(KernelArgumentError, match=match):
        check_sinks(sinks, 4, torch.device("cpu"))


def test_sinks_on_another_device_are_refused():
    with pytest.raises(KernelArgumentError, match="sinks is on cpu but q is on meta"):
        check_sinks(torch.zeros(4), 4, torch.device("meta"))
