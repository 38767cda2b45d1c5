"""``+impl=paged`` runs the paged kernel that is native to the device: Triton on a GPU (or a simulated one),
the paged_cuda op's C++ kernel on a CPU; and a timed Triton row on a CPU says it ran in the interpreter."""

from __future__ import annotations

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.resolve import resolve


@pytest.mark.parametrize("extra, name, kernel", [
    (["device=cpu"], "paged_cuda", "cuda"),
    (["device=cpu", "scenario=capacity"], "paged_cuda", "cuda"),  # the CPU's own steps, as a profile would time
    (["device=cpu", "scenario=capacity", "gpu=h100-sxm"], "paged_triton", "triton"),  # a simulated GPU's kernel
    (["device=cpu", "impl.prefix_caching=false"], "paged_cuda", "cuda"),  # the user's overrides are kept
])
def test_paged_is_the_native_kernel_of_the_device(compose, extra, name, kernel):
    cfg = resolve(compose(["+impl=paged", "model=tiny-llama", *extra]))
    assert (cfg.impl.name, cfg.impl.kernel) == (name, kernel)
    assert cfg.impl.prefix_caching is ("impl.prefix_caching=false" not in extra)


def test_the_triton_impl_by_name_stays_triton_and_native_fits_only_a_paged_cache(compose):
    cfg = resolve(compose(["+impl=paged_triton", "model=tiny-llama", "device=cpu"]))
    assert (cfg.impl.name, cfg.impl.kernel) == ("paged_triton", "triton")
    with pytest.raises(ConfigError, match="impl.kernel"):
        resolve(compose(["+impl=contiguous", "impl.kernel=native", "model=tiny-llama", "device=cpu"]))


def test_a_timed_triton_row_on_cpu_says_it_ran_in_the_interpreter(compose, tmp_path):
    from kvbench.harness.front.job import run_job
    from kvbench.kernels.registry import INTERPRETED_NOTE

    small = ["model=tiny-llama", "device=cpu", "batch=2", "workload=fixed", "workload.num_requests=2",
             "workload.prompt_len=8", "workload.output_len=2", "scenario.warmup=0"]
    rows, code = run_job(compose(["+impl=paged_triton", *small]), tmp_path / "t")
    assert code == 0 and INTERPRETED_NOTE in rows[0]["notes"]
    rows, code = run_job(compose(["+impl=paged", *small]), tmp_path / "p")
    assert code == 0 and rows[0]["impl"] == "paged_cuda" and INTERPRETED_NOTE not in (rows[0]["notes"] or "")
