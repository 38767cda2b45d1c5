"""conf/gpu/: each card's memory is the total its driver reports (``memory_mib``, bytes inside), within a few % of the
datasheet's figure read in the unit the datasheet means (GiB), and a 70B model on two H100s gets the KV they hold."""

from __future__ import annotations

import pytest

from kvbench.harness.config import GpuConfig
from kvbench.harness.front.groups import load_group
from kvbench.harness.front.resolve import resolve
from kvbench.harness.kv.budget import kv_budget
from kvbench.harness.serving.cost_model import gpu_spec
from tests.conftest import REPO_ROOT

GPUS = sorted(p.stem for p in (REPO_ROOT / "conf" / "gpu").glob("*.yaml"))
# Each datasheet's memory figure ("80GB", "141GB", ...) and the share of it in-band ECC keeps (on by default on the
# GDDR6 data-centre cards: 1/16; HBM carries its ECC out of band). The datasheets write GB and mean GiB.
DATASHEET = {"a100-40gb": (40, 0), "a100-80gb": (80, 0), "a100-80gb-pcie": (80, 0), "h100-sxm": (80, 0),
             "h100-pcie": (80, 0), "h100-nvl": (94, 0), "h200": (141, 0), "l4": (24, 1 / 16), "l40s": (48, 1 / 16),
             "rtx-4090": (24, 0)}
# Llama-2-70B: Llama-3.1-70B's shape with Llama 2's 32,000-token vocabulary and 4,096-token context.
LLAMA_2_70B = ["model=llama-3.1-70b", "model.vocab_size=32000", "model.max_position_embeddings=4096",
               "max_seq_len=4096"]


def test_every_gpu_file_has_its_datasheet_figure_here():
    assert set(DATASHEET) == set(GPUS)


@pytest.mark.parametrize("name", GPUS)
def test_memory_is_the_drivers_total_in_the_datasheets_unit(name):
    spec = gpu_spec(load_group("gpu", name, GpuConfig))
    figure, ecc = DATASHEET[name]
    assert spec.memory_bytes == round(spec.memory_mib * 2**20)
    # Within 2% of the datasheet's GiB less ECC's share (the driver keeps a few hundred MiB: H100 81559 of 81920).
    assert spec.memory_bytes == pytest.approx(figure * 2**30 * (1 - ecc), rel=0.02)
    if not ecc:  # read as decimal GB (roofline version 4) every HBM card and the 4090 lose over 5%
        assert spec.memory_bytes > 1.05 * figure * 1e9
    text = (REPO_ROOT / "conf" / "gpu" / f"{name}.yaml").read_text().splitlines()
    (i,) = [i for i, line in enumerate(text) if line.startswith("memory_mib:")]
    above = " ".join(line for line in text[max(0, i - 4):i] if line.startswith("#"))
    assert "nvidia-smi" in text[i] and f"{spec.memory_mib:.0f}MiB" in above  # the figure, quoted from its source
    assert any(w in above for w in ("issue #", "PR #", "results/")), f"{name}: no source for memory_mib: {above!r}"


def test_llama_2_70b_on_two_h100s_gets_the_kv_the_cards_hold(compose):
    base = ["+impl=paged_torch", "scenario=capacity", "gpu=h100-sxm", "gpu.count=2", "dtype=bfloat16", *LLAMA_2_70B]
    cfg = resolve(compose(base))
    budget = kv_budget(cfg)
    # 2 x 81559 MiB = 171.04 GB x 0.9 = 153.94 GB, less 137.95 GB of weights and the activation estimate.
    assert budget.device_bytes == pytest.approx(2 * 81559 * 2**20, abs=1)
    assert budget.kv_bytes > 10e9
    # Read as 2 x 80e9 bytes it had under 4 GB: the 9.9 GB between them is the unit alone.
    decimal = kv_budget(resolve(compose([*base, "device.memory_gb=160"])))
    assert decimal.kv_bytes < 4e9
    assert budget.kv_bytes - decimal.kv_bytes == pytest.approx(0.9 * (2 * 81559 * 2**20 - 160e9), rel=1e-6)
