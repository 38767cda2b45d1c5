"""The device slug names the machine's model: two machines that measure differently never share a folder."""

import pytest

from harness.measure.fingerprint import auto_device_slug, cpu_model_slug


@pytest.mark.parametrize("brand, slug", [
    ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", "intel-xeon-platinum-8481c"),
    ("Intel(R) Xeon(R) Processor", "intel-xeon"),
    ("AMD EPYC 7B13 64-Core Processor", "amd-epyc-7b13"),
    ("AMD Ryzen 7 PRO 7840U w/ Radeon 780M Graphics", "amd-ryzen-7-pro-7840u"),
    ("Intel(R) Core(TM) i7-10700K CPU @ 3.80GHz", "intel-core-i7-10700k"),
    ("Apple M2 Max", "apple-m2-max"),
    ("", "unknown"),
])
def test_cpu_model_slug_keeps_vendor_family_and_model(brand, slug):
    assert cpu_model_slug(brand) == slug


def test_an_amd_and_an_intel_machine_of_two_cores_get_different_slugs():
    assert cpu_model_slug("AMD EPYC 7B13 64-Core Processor") != cpu_model_slug("Intel(R) Xeon(R) Processor")


def test_this_machines_slug_names_its_cpu_and_cores():
    import os

    from kernels.cuda_available import cuda_available

    if cuda_available():
        pytest.skip("a GPU machine's slug is its GPU's")
    slug = auto_device_slug()
    assert slug.startswith("cpu-") and slug.endswith(f"-{os.cpu_count()}core") and slug != f"cpu-{os.cpu_count()}core"


def test_the_fingerprint_read_without_torch_is_the_one_torch_gives(monkeypatch):
    """A CPU run that has not loaded torch reads its versions from torch/version.py: the same values."""
    import sys

    import torch

    from harness.measure.fingerprint import collect

    with_torch = collect("cpu")
    monkeypatch.delitem(sys.modules, "torch")  # as in a process that never imported it
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    without = collect("cpu")
    assert without == with_torch
    assert (without.torch_version, without.cuda_version) == (torch.__version__, torch.version.cuda)
