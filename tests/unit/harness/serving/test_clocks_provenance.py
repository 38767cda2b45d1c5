"""A clock profile records what measured it, and prices only that (harness/serving/clocks.py): a run of another
model, dtype, KV store, kernel or device is refused in one line naming each difference, then and now, unless
``clock_profile_allow_mismatch=true`` (then the row's notes name them); another commit is only a note; a table
made before the record is refused unless allowed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from kvbench.harness.front.job import run_job
from kvbench.harness.serving.clocks import names_gpu, this_machine
from kvbench.harness.serving.profile_table import PROVENANCE, Provenance, point, profile_frame

SMALL = ["model=tiny-llama", "device=cpu", "max_seq_len=64", "batch=4", "workload=uniform", "workload.num_requests=8",
         "workload.prompt_len=12", "workload.output_len=6", "device.kv_cache_gb=0.001", "scenario=capacity",
         "arrival=poisson", "arrival.rate=20"]
ALLOW = "clock_profile_allow_mismatch=true"
H100 = {"device_slug": "nvidia-h100-80gb-hbm3", "device_name": "NVIDIA H100 80GB HBM3"}


def _here() -> Provenance:
    """tiny-llama's float32 paged_torch profile measured on this machine, at this commit."""
    fp = this_machine("cpu")
    return Provenance("tiny-llama", "float32", "float32", None, "torch", fp.device_slug, fp.gpu_name or fp.cpu_name,
                      fp.git_sha)


def _points(impl: str) -> list[dict]:
    decode = [point(impl, "decode", [s * 0.95, s, s * 1.05], batch=b, context=c)
              for b in (1, 4) for c, s in ((10.0, 0.002 * b), (40.0, 0.003 * b))]
    return decode + [point(impl, "prefill", [s * 0.95, s, s * 1.05], tokens=t) for t, s in ((16, 0.004), (64, 0.01))]


def _profile(tmp_path: Path, made_by: Provenance | None, impl: str = "paged_torch") -> Path:
    """A run folder holding a profile of ``impl`` recorded as ``made_by`` (None: a table made before the record)."""
    folder = tmp_path / "profile"
    folder.mkdir()
    df = profile_frame(_points(impl), made_by or _here())
    (df.drop(columns=PROVENANCE) if made_by is None else df).to_parquet(folder / "profile.parquet", index=False)
    return folder


def _run(compose, tmp_path: Path, profile: Path, *extra: str, impl: str = "paged_torch") -> tuple[dict, int]:
    (row,), code = run_job(compose([f"+impl={impl}", *SMALL, f"clock_profile={profile}", *extra]),
                           tmp_path / "run")
    return row, code


def _refused(row: dict, code: int) -> str:
    assert code == 2 and row["status"] == "error" and row.get("tpot_ms_p50") is None
    message = row["error"]
    assert "\n" not in message and "profile.parquet" in message and ALLOW in message
    return message


def test_a_profile_of_this_setting_prices_the_run_without_a_provenance_note(compose, tmp_path):
    row, code = _run(compose, tmp_path, _profile(tmp_path, _here()))
    assert code == 0 and row["status"] == "ok" and row["tpot_ms_p50"] > 0
    assert "clock_profile" not in (row["notes"] or "")


def test_a_tiny_llama_profile_does_not_price_a_70b_run(compose, tmp_path):
    """The issue's: a profile measured on tiny-llama priced a llama-3.1-70b run, status ok, no note."""
    profile = _profile(tmp_path, _here())
    row, code = _run(compose, tmp_path, profile, "model=llama-3.1-70b", "device.memory_gb=400", "device.kv_cache_gb=2")
    message = _refused(row, code)
    assert "was measured on other settings than this run: model tiny-llama (this run: llama-3.1-70b);" in message
    # the run itself is one the profile can price: allowed, it is ok and says what it was priced from
    (row,), code = run_job(compose(["+impl=paged_torch", *SMALL, f"clock_profile={profile}", "model=llama-3.1-70b",
                                    "device.memory_gb=400", "device.kv_cache_gb=2", ALLOW]), tmp_path / "allowed")
    assert code == 0 and row["tpot_ms_p50"] > 0 and "model tiny-llama (this run: llama-3.1-70b)" in row["notes"]


def test_a_profile_from_a_cpu_does_not_price_a_simulated_gpu(compose, tmp_path):
    """The same profile for a 70b run on two simulated H100s: every setting that differs is named."""
    row, code = _run(compose, tmp_path, _profile(tmp_path, _here()), "model=llama-3.1-70b", "gpu=h100-sxm",
                     "gpu.count=2", "device.kv_cache_gb=2")
    message = _refused(row, code)
    for said in ("model tiny-llama (this run: llama-3.1-70b)", "dtype float32 (this run: bfloat16)",
                 "kv_dtype float32 (this run: bfloat16)", f"device {_here().device_slug} (this run: gpu=h100-sxm)"):
        assert said in message


@pytest.mark.parametrize("then, extra, said", [
    ({"model": "llama-58m"}, (), "model llama-58m (this run: tiny-llama)"),
    ({"dtype": "bfloat16", "kv_dtype": "bfloat16"}, (), "dtype bfloat16 (this run: float32)"),
    ({"kernel": "triton"}, (), "kernel triton (this run: torch)"),
    (H100, (), f"device nvidia-h100-80gb-hbm3 (this run: {this_machine('cpu').device_slug})"),
    ({"device_slug": "cpu-amd-epyc-7b13-2core"}, (), "device cpu-amd-epyc-7b13-2core (this run:"),
    ({}, ("kv_dtype=int8",), "kv_dtype float32 (this run: int8), kv_scale unrecorded (this run: tensor)"),
    ({}, ("impl.kernel=triton",), "kernel torch (this run: triton)"),
], ids=["model", "dtype", "kernel", "gpu-vs-cpu", "another-cpu", "kv-store", "kernel-override"])
def test_each_setting_that_differs_is_refused_by_name(compose, tmp_path, then, extra, said):
    row, code = _run(compose, tmp_path, _profile(tmp_path, replace(_here(), **then)), *extra)
    assert said in _refused(row, code)


def test_allowed_a_mismatch_prices_the_run_and_its_notes_name_the_differences(compose, tmp_path):
    profile = _profile(tmp_path, replace(_here(), model="llama-58m", kernel="triton"))
    row, code = _run(compose, tmp_path, profile, ALLOW)
    assert code == 0 and row["status"] == "ok" and row["tpot_ms_p50"] > 0
    assert ("clock_profile measured on other settings: model llama-58m (this run: tiny-llama), kernel triton "
            f"(this run: torch) ({ALLOW})") in row["notes"]


@pytest.mark.parametrize("sha, said", [("0123456789abcdef" * 2 + "01234567", "kvbench 0123456789ab"),
                                       (None, "kvbench an unrecorded commit")])
def test_another_commit_is_a_note_never_a_refusal(compose, tmp_path, sha, said):
    row, code = _run(compose, tmp_path, _profile(tmp_path, replace(_here(), git_sha=sha)))
    assert code == 0 and row["status"] == "ok"
    now = (_here().git_sha or "")[:12] or "an unrecorded commit"
    assert f"clock_profile measured at {said} (this run: {now})" in row["notes"]


def test_a_profile_made_before_the_record_is_refused_unless_allowed(compose, tmp_path):
    profile = _profile(tmp_path, None)
    message = _refused(*_run(compose, tmp_path, profile))
    assert "records no provenance" in message and "measure it again with scenario=profile" in message
    (row,), code = run_job(compose(["+impl=paged_torch", *SMALL, f"clock_profile={profile}", ALLOW]), tmp_path / "ok")
    assert code == 0 and row["status"] == "ok"
    assert "clock_profile records no provenance" in row["notes"] and ALLOW in row["notes"]


def test_rows_of_one_impl_that_disagree_on_a_setting_are_refused_even_allowed(compose, tmp_path):
    folder = _profile(tmp_path, _here())
    df = pd.read_parquet(folder / "profile.parquet")
    df.loc[df.kind == "prefill", "device_slug"] = "nvidia-h100-80gb-hbm3"  # two machines' tables joined
    df.to_parquet(folder / "profile.parquet", index=False)
    row, code = _run(compose, tmp_path, folder, ALLOW)
    assert code == 2 and "the rows of impl 'paged_torch' disagree on device_slug" in row["error"]


def test_another_impls_profile_asked_for_prices_with_a_note_naming_its_kernel(compose, tmp_path):
    """clock_profile_impl names the other impl: its kernel comes with it, noted; the rest must still match."""
    profile = _profile(tmp_path, _here())
    row, code = _run(compose, tmp_path, profile, "clock_profile_impl=paged_torch", impl="paged_cuda")
    assert code == 0 and row["status"] == "ok"
    assert "priced by impl paged_torch's profile (clock_profile_impl): kernel torch (this run: cuda)" in row["notes"]
    row, code = run_job(compose(["+impl=paged_cuda", *SMALL, f"clock_profile={profile}",
                                 "clock_profile_impl=paged_torch", "model=llama-58m"]), tmp_path / "other")
    assert code == 2 and "model tiny-llama (this run: llama-58m)" in row[0]["error"]


def test_a_gpu_profile_prices_a_run_that_names_that_gpu(compose, tmp_path):
    gpu = replace(_here(), dtype="bfloat16", kv_dtype="bfloat16", **H100)
    row, code = _run(compose, tmp_path, _profile(tmp_path, gpu), "gpu=h100-sxm")
    assert code == 0 and row["status"] == "ok" and "other settings" not in (row["notes"] or "")
    row, code = run_job(compose(["+impl=paged_torch", *SMALL, f"clock_profile={tmp_path / 'profile'}",
                                 "gpu=a100-80gb"]), tmp_path / "a100")
    assert code == 2 and "device nvidia-h100-80gb-hbm3 (this run: gpu=a100-80gb)" in row[0]["error"]


@pytest.mark.parametrize("name, match, same", [
    ("NVIDIA H100 80GB HBM3", ["h100"], True),
    ("NVIDIA H100 PCIe", ["h100"], False),  # a conf/gpu/ file names it with more words: another part
    ("NVIDIA H100 PCIe", ["h100", "pcie"], True),
    ("NVIDIA A100-SXM4-80GB", ["a100", "80gb"], True),
    ("NVIDIA A100-SXM4-40GB", ["a100", "80gb"], False),
    ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", ["h100"], False),
    ("NVIDIA H100 80GB HBM3", [], False),  # a GPU spec with no words names no measured GPU
])
def test_a_gpu_is_named_by_its_match_words_and_no_more_specific_file(name, match, same):
    made_by = replace(_here(), device_slug=None, device_name=name)
    assert names_gpu(made_by, match) is same


def test_scenario_profile_records_what_measured_it_and_a_run_reads_it_back(compose, tmp_path):
    """A real profile job's table: its record is the job's own fingerprint, and it prices this setting only."""
    profile = ["scenario=profile", "scenario.batches=[1,2]", "scenario.contexts=[8]", "scenario.decode_steps=2",
               "scenario.prefill_tokens=[16,32]", "scenario.passes=1", "scenario.warmup=0", "cpu_threads=1"]
    rows, code = run_job(compose(["+impl=paged_torch", *SMALL[:-3], *profile]), tmp_path / "profile")
    assert code == 0, rows[0].get("error")
    table = pd.read_parquet(tmp_path / "profile" / "profile.parquet")
    job = rows[0]
    assert (table.model == "tiny-llama").all() and (table.dtype == "float32").all()
    assert (table.kv_dtype == "float32").all() and table.kv_scale.isna().all() and (table.kernel == "torch").all()
    assert (table.device_slug == job["device_slug"]).all() and (table.device_name == job["cpu_name"]).all()
    assert (table.git_sha == job["git_sha"]).all()
    row, code = _run(compose, tmp_path, tmp_path / "profile")
    assert code == 0 and "clock_profile" not in (row["notes"] or "")
    row, code = run_job(compose(["+impl=paged_torch", *SMALL, f"clock_profile={tmp_path / 'profile'}",
                                 "model=llama-58m"]), tmp_path / "other")
    assert code == 2 and "model tiny-llama (this run: llama-58m)" in row[0]["error"]


def test_step_clock_given_the_impl_compares_its_kernel_when_the_job_runs_every_impl(compose, tmp_path):
    from kvbench.harness.config import ImplConfig
    from kvbench.harness.errors import ConfigError
    from kvbench.harness.front.resolve import resolve
    from kvbench.harness.serving.clocks import step_clock

    cfg = resolve(compose([*SMALL, f"clock_profile={_profile(tmp_path, _here())}"]))
    assert cfg.impl is None
    clock, source = step_clock(cfg, ImplConfig(name="paged_torch", kernel="torch"))
    assert source == clock.id and clock.notes == ()
    with pytest.raises(ConfigError, match=r"kernel torch \(this run: triton\)"):
        step_clock(cfg, ImplConfig(name="paged_torch", kernel="triton"))
