"""conf/gpu/: every spec loads and validates; gpu=NAME sizes the capacity scenario's device; bad input is one line."""

from __future__ import annotations

import re

import pytest

from kvbench.harness.kv.budget import kv_budget
from kvbench.harness.config import Config, GpuConfig
from kvbench.harness.scenarios.capacity import CapacityScenario
from kvbench.harness.serving.cost_model import cost_model_for, gpu_spec
from kvbench.harness.errors import ConfigError
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.front.resolve import resolve
from kvbench.harness.front.job import run_job
from tests.conftest import REPO_ROOT

GPUS = sorted(p.stem for p in (REPO_ROOT / "conf" / "gpu").glob("*.yaml"))
SOURCED = ("memory_mib", "bandwidth_gbps", "tflops", "fp8_tflops", "interconnect_gbps", "interconnect_latency_us")
# The roofline's modelling figures: each says where it comes from, a measurement, a source or "assumption".
# (A step's and a layer's fixed costs are the engine's since roofline version 6: test_engine_profile.py.)
MODELLED = ("copy_bandwidth_gbps", "bw_efficiency", "flops_efficiency", "flops_efficiency_small", "flops_ramp_gflop",
            "fp8_flops_efficiency", "attn_bw_efficiency")


def _comment_of(text: list[str], i: int) -> str:
    """Line i's own comment and the comment lines right above it."""
    above = []
    j = i - 1
    while j >= 0 and text[j].startswith("#"):
        above.append(text[j])
        j -= 1
    return " ".join(above + [text[i].partition("#")[2]])


def test_the_issue_names_are_all_there():
    assert {"a100-40gb", "a100-80gb", "h100-sxm", "h200", "l4", "rtx-4090"} <= set(GPUS)


@pytest.mark.parametrize("name", GPUS)
def test_spec_loads_validates_and_cites_its_figures(compose, name):
    cfg = resolve(compose(["scenario=capacity", "model=llama-2-7b", f"gpu={name}"]))
    spec = gpu_spec(cfg.gpu)  # every figure filled and in range
    assert spec.name == name and spec.count == 1
    assert 0 < spec.bw_efficiency <= 1 and 0 < spec.flops_efficiency <= 1
    assert cost_model_for(cfg).decode_s(1, 1) > 0
    text = (REPO_ROOT / "conf" / "gpu" / f"{name}.yaml").read_text().splitlines()
    for key in SOURCED:  # each datasheet figure carries its source: a comment on its line or the one above
        (i,) = [i for i, line in enumerate(text) if line.startswith(f"{key}:")]
        assert "#" in text[i] or text[i - 1].startswith("#"), f"{name}: {key} has no source"
    for key in MODELLED:  # and each modelling figure is set here, saying what it rests on
        (i,) = [i for i, line in enumerate(text) if line.startswith(f"{key}:")]
        comment = _comment_of(text, i).lower()
        assert key in comment or i > 0 and "#" in text[i], f"{name}: {key} has no comment of its own"
        assert any(w in comment for w in ("assumption", "measured", "source")), f"{name}: {key}: {comment!r}"
    assert spec.copy_bandwidth_gbps is None or spec.copy_bandwidth_gbps <= spec.bandwidth_gbps


def test_a_gpu_figure_left_unset_is_named(compose):
    cfg = resolve(compose(["scenario=capacity", "model=llama-2-7b", "gpu=h200"]))
    cfg.gpu.attn_bw_efficiency = None  # as a GPU file written before the key would leave it
    with pytest.raises(ConfigError, match=r"^gpu=h200: gpu\.attn_bw_efficiency not set"):
        gpu_spec(cfg.gpu)
    cfg.gpu.attn_bw_efficiency, cfg.gpu.copy_bandwidth_gbps = 0.6, None  # null: no measurement, allowed
    assert gpu_spec(cfg.gpu).achievable_gbps == pytest.approx(4800 * 0.8)


def test_gpu_sets_the_capacity_budget_times_count(compose):
    cfg = resolve(compose(["scenario=capacity", "model=llama-2-7b", "gpu=a100-80gb", "gpu.count=2"]))
    # 2 x 81920 MiB (80 GiB a card, as nvidia-smi reports it) = 171,798,691,840 bytes = 171.8 decimal GB.
    assert cfg.device.memory_gb == pytest.approx(171.79869184, rel=1e-12) and cfg.dtype == "bfloat16"
    budget = kv_budget(cfg)  # a simulated GPU counts as a GPU
    assert abs(budget.device_bytes - 2 * 81920 * 2**20) <= 1 and budget.source == "device.memory_gb"
    # An explicit device.memory_gb still wins; the decode scenario (real device) is left alone.
    assert resolve(compose(["scenario=capacity", "model=llama-2-7b", "gpu=h200", "device.memory_gb=90"])
                   ).device.memory_gb == 90
    from kvbench.harness.front.resolve import CPU_MEMORY_GB

    assert resolve(compose(["scenario=decode", "device=cpu", "gpu=h200"])).device.memory_gb == CPU_MEMORY_GB


def test_gpu_budget_in_a_capacity_row(compose, tmp_path):
    (row,), code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "model=llama-3.1-70b", "gpu=h200",
                                    "gpu.count=8", "scenario.concurrency_points=[1]"]), tmp_path)
    assert code == 0, row.get("error")
    assert abs(row["budget_device_bytes"] - 8 * 143771 * 2**20) <= 1  # 8 x nvidia-smi's 143771 MiB


def test_a_python_gpu_config_takes_the_spec_figures_it_leaves_out():
    cfg = resolve(Config(scenario=CapacityScenario(), model=ModelConfig(name="llama-2-7b"),
                         gpu=GpuConfig(name="h100-sxm", bandwidth_gbps=3000)))
    assert cfg.gpu.bandwidth_gbps == 3000 and cfg.gpu.tflops == 989
    assert cfg.device.memory_gb == pytest.approx(81559 * 2**20 / 1e9, rel=1e-12)  # 85.52 GB, not 80


def test_unknown_gpu_name_lists_the_names(compose):
    with pytest.raises(ConfigError) as err:
        resolve(compose(["scenario=capacity", "gpu=h200", "gpu.name=h300"]))
    msg = str(err.value)
    assert "\n" not in msg and "gpu.name='h300'" in msg and all(name in msg for name in GPUS)


def test_weights_that_do_not_fit_name_the_gpu_and_both_sizes(compose, tmp_path):
    (row,), code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "model=llama-3.1-70b", "gpu=l4",
                                    "gpu.count=2"]), tmp_path)
    assert code == 2 and row["status"] == "error"
    msg = row["error"]
    assert "\n" not in msg and "gpu=l4" in msg and "gpu.count=2" in msg
    # 2 x 23034 MiB (L4: 24 GiB less ECC's 1/16) = 48.31 GB, x 0.9 = 43.5 GB.
    assert "43.5 GB usable" in msg and re.search(r"weights of model=llama-3.1-70b \(141\.\d GB", msg)


def test_a_cost_figure_of_zero_names_its_key(compose, tmp_path):
    (row,), code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "model=llama-2-7b", "gpu=h200",
                                    "gpu.bandwidth_gbps=0"]), tmp_path)
    assert code == 2 and row["status"] == "error" and "gpu.bandwidth_gbps=0" in row["error"]
    assert "\n" not in row["error"]
