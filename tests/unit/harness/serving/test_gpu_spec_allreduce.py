"""The all-reduce a GPU file prices by GPU count (roofline version 11, ``allreduce_by_count``): the measured row for
the count, the two-GPU figures for any other, and rows that say what they must be."""

from __future__ import annotations

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.resolve import resolve
from kvbench.harness.serving.cost_model import cost_model_for
from kvbench.harness.serving.gpu_spec import GpuSpec

BASE = dict(name="x", memory_mib=81920, bandwidth_gbps=3000, tflops=900, bw_efficiency=0.8, flops_efficiency=0.7,
            interconnect_gbps=370, interconnect_latency_us=10)


def test_a_listed_count_takes_its_measured_row_and_any_other_the_two_gpu_figures():
    rows = ((4, 19.0, 318.0), (8, 28.0, 333.0))
    assert GpuSpec(**BASE, count=8, allreduce_by_count=rows).allreduce() == (28.0, 333.0)
    assert GpuSpec(**BASE, count=4, allreduce_by_count=rows).allreduce() == (19.0, 318.0)
    assert GpuSpec(**BASE, count=2, allreduce_by_count=rows).allreduce() == (10, 370)
    assert GpuSpec(**BASE, count=6, allreduce_by_count=rows).allreduce() == (10, 370)  # not measured: no guess


def test_a_decode_all_reduce_on_eight_h200s_is_priced_from_their_row(compose):
    cfg = resolve(compose(["scenario=capacity", "model=llama-3.1-70b", "gpu=h200", "gpu.count=8", "+impl=paged"]))
    clock = cost_model_for(cfg)
    message = 512 * 8192 * 2  # 512 decode rows of Llama-3.1-70B's hidden size in fp16: 8 MiB
    one = 28e-6 + 2 * 7 / 8 * message / 338e9  # conf/gpu/h200.yaml's 8-GPU row
    assert clock.comm_s(512) == pytest.approx(2 * 80 * one)
    two = resolve(compose(["scenario=capacity", "model=llama-3.1-70b", "gpu=h200", "gpu.count=2", "+impl=paged"]))
    assert cost_model_for(two).comm_s(512) == pytest.approx(2 * 80 * (10e-6 + message / 370e9))


@pytest.mark.parametrize("rows, expected", [
    ("[[1,10,100]]", r"\[1, 10, 100\].*count an integer >= 2"),
    ("[[4,-1,100]]", r"latency_us >= 0"),
    ("[[4,10]]", r"each row is \[count, latency_us, busbw_gbps\]"),
    ("[[4.5,10,100]]", r"count an integer >= 2"),
    ("[[4,10,0]]", r"busbw_gbps > 0"),
    ("[[4,10,100],[4,12,90]]", r"lists a GPU count twice: \[4, 4\]"),
])
def test_a_bad_row_is_named_with_what_a_row_must_be(compose, rows, expected):
    with pytest.raises(ConfigError, match=r"gpu.allreduce_by_count.*" + expected):
        cost_model_for(resolve(compose(["scenario=capacity", "gpu=h200", "gpu.count=4", "+impl=paged",
                                        f"gpu.allreduce_by_count={rows}"])))


def test_below_the_fitted_sizes_the_time_runs_from_the_empty_messages_latency():
    # The 8-GPU row was fitted on 1-32 MiB, where NCCL's protocols put its intercept at 28 us; a batch-1 decode's
    # 16 KiB all-reduce takes about the empty message's 10 us (gpt-fast's 8-GPU steps: test_cost_model_reference.py)
    spec = GpuSpec(**BASE, count=8, allreduce_by_count=((8, 28.0, 333.0),))
    at_fit = 28e-6 + 1.75 * 2**20 / 333e9
    assert spec.allreduce_s(2**20) == pytest.approx(at_fit)
    assert spec.allreduce_s(0) == pytest.approx(10e-6)
    assert spec.allreduce_s(2**18) == pytest.approx(10e-6 + (at_fit - 10e-6) / 4)
    assert spec.allreduce_s(2**22) == pytest.approx(28e-6 + 1.75 * 2**22 / 333e9)
    plain = GpuSpec(**BASE, count=8)  # no measured row: the affine two-GPU figures at every size
    assert plain.allreduce_s(2**18) == pytest.approx(10e-6 + 1.75 * 2**18 / 370e9)
