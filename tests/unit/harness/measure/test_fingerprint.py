"""The device slug names the machine's model: two machines that measure differently never share a folder."""

import pytest

from kvbench.harness.measure.fingerprint import auto_device_slug, cpu_model_slug


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

    from kvbench.kernels.cuda_available import cuda_available

    if cuda_available():
        pytest.skip("a GPU machine's slug is its GPU's")
    slug = auto_device_slug()
    assert slug.startswith("cpu-") and slug.endswith(f"-{os.cpu_count()}core") and slug != f"cpu-{os.cpu_count()}core"


def test_the_fingerprint_read_without_torch_is_the_one_torch_gives(monkeypatch):
    """A CPU run that has not loaded torch reads its versions from torch/version.py: the same values."""
    import sys

    import torch

    from kvbench.harness.measure.fingerprint import collect

    with_torch = collect("cpu")
    monkeypatch.delitem(sys.modules, "torch")  # as in a process that never imported it
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    without = collect("cpu")
    assert without == with_torch
    assert (without.torch_version, without.cuda_version) == (torch.__version__, torch.version.cuda)


# ---- env.json: torch's own report of the environment beside the fingerprint ------------------------------

ROW_FIELDS = ["device", "device_slug", "gpu_name", "gpu_count", "gpu_memory_bytes", "driver_version", "cuda_version",
              "cpu_name", "cpu_count", "torch_version", "triton_version", "python_version", "git_sha", "git_dirty",
              "hostname_hash"]


@pytest.fixture
def fresh_environment():
    from kvbench.harness.measure.fingerprint import torch_environment

    torch_environment.cache_clear()
    yield torch_environment
    torch_environment.cache_clear()


def test_env_json_adds_torchs_report_and_the_rows_keep_their_columns(fresh_environment):
    import json

    from kvbench.harness.measure.fingerprint import collect, env_record

    fp = collect("cpu")
    assert list(fp.as_dict()) == ROW_FIELDS  # what every row carries: unchanged
    record = env_record(fp)
    assert list(record) == [*ROW_FIELDS, "torch_environment"]
    env = record["torch_environment"]
    json.dumps(record)  # env.json is JSON
    import torch

    assert env["blas_info"] and env["blas_info"] in env["build"]  # BLAS, from torch's build configuration
    assert env["num_threads"] == torch.get_num_threads() and "ATen/Parallel" in env["parallel_info"]
    assert "cudnn_version" in env and "os" in env and "cpu_info" in env
    assert env["cuda_module_loading"] == "N/A"  # a CPU run never initialises CUDA for it
    assert 0 <= env["seconds"] < 3  # no pip list: about 0.1 s here (0.6 s with it)
    assert fresh_environment("cpu") is env  # once a process
    assert env_record(fp, with_torch=False)["torch_environment"] is None  # a bookkeeping run loads no torch


def test_a_report_that_fails_is_named_not_raised(fresh_environment, monkeypatch):
    from torch.utils import collect_env

    def broken(*args):
        raise OSError("no lsb_release")

    monkeypatch.setattr(collect_env, "get_os", broken)
    monkeypatch.setattr(collect_env, "get_cuda_module_loading_config", broken)  # not asked on a CPU run
    env = fresh_environment("cpu")
    assert env["os"] is None and env["errors"] == {"os": "OSError: no lsb_release"}
    assert env["cuda_module_loading"] == "N/A"
