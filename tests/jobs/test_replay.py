"""``python -m harness.replay RUN_DIR``: the saved config alone reproduces the run's digests."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.job import run_job
from tests.conftest import REPO_ROOT
from tests.helpers.harness_proc import env

SMALL = ["+impl=paged_torch", "model=tiny-llama", "device=cpu", "max_seq_len=48", "workload=uniform", "batch=3",
         "workload.prompt_len=8", "workload.output_len=4", "scenario.warmup=0", "seed=5"]


def replay(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.front.replay", *args], cwd=REPO_ROOT, env=env(**extra_env),
                          capture_output=True, text=True, timeout=300)


def test_a_replay_reproduces_the_digests_and_names_what_changed(compose, tmp_path, monkeypatch):
    original, replayed = tmp_path / "run", tmp_path / "replay"
    # The original ran from a dirty checkout of another commit (whatever state this checkout is in).
    monkeypatch.setenv("KVBENCH_GIT_SHA", "fedc9876")
    monkeypatch.setenv("KVBENCH_GIT_DIRTY", "1")
    rows, code = run_job(compose(SMALL), original)
    monkeypatch.delenv("KVBENCH_GIT_SHA")
    monkeypatch.delenv("KVBENCH_GIT_DIRTY")
    assert code == 0
    # Another commit of the code: the one fingerprint field that differs.
    p = replay(str(original), "--out", str(replayed), KVBENCH_GIT_SHA="0123abcd", KVBENCH_GIT_DIRTY="0")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "workload digest same, output digest same" in p.stdout
    before, after = rows[0], pd.read_parquet(replayed / "rows.parquet").iloc[0]
    assert after.status == "ok" and after.seed == 5 and after.job_id == before["job_id"]
    assert (after.workload_digest, after.output_digest) == (before["workload_digest"], before["output_digest"])
    assert after.replay_of.endswith("run") and pd.isna(before.get("replay_of"))
    changed = dict(part.split(": ", 1) for part in after.fingerprint_diff.split("; "))
    assert set(changed) == {"git_sha", "git_dirty"} and changed["git_sha"].endswith("-> 0123abcd")


def test_a_folder_without_a_config_is_a_one_line_error(tmp_path):
    p = replay(str(tmp_path), "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and "has no config.yaml" in p.stderr and "Traceback" not in p.stderr


# ---- a results folder is data: nothing in it runs, nothing of the environment leaks -------------------

@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A finished run folder to tamper with (its config.yaml is what a shared results folder holds)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from kvbench.harness.front.schemas import register_configs

    register_configs()
    folder = tmp_path_factory.mktemp("saved") / "run"
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base=None):
        cfg = hydra_compose("config", overrides=["progress=false", *SMALL])
    rows, code = run_job(cfg, folder)
    assert code == 0
    return folder


def tampered(saved_run: Path, tmp_path: Path, edit) -> Path:
    folder = tmp_path / "shared"
    shutil.copytree(saved_run, folder)
    path = folder / "config.yaml"
    path.write_text(edit(path.read_text()))
    return folder


SECRET = "s3cr3t-token-value"


@pytest.mark.parametrize("edit, key", [
    (lambda t: re.sub(r"^seed: .*$", "seed: ${oc.env:SECRET_TOKEN}", t, flags=re.M), "seed"),
    (lambda t: re.sub(r"^  name: tiny-llama$", "  name: ${oc.env:SECRET_TOKEN}", t, flags=re.M), "model.name"),
    (lambda t: re.sub(r"^  path: null$", "  path: ${oc.env:SECRET_TOKEN,/tmp}/x", t, count=1, flags=re.M), "path"),
    (lambda t: t + "extra_note: prefix-${oc.env:SECRET_TOKEN}\n", "extra_note"),
    (lambda t: re.sub(r"^batch: .*$", "batch: ${max_seq_len}", t, flags=re.M), "batch"),
    (lambda t: re.sub(r"^  concurrency_points:\n", "  concurrency_points:\n  - ${oc.env:SECRET_TOKEN}\n", t, flags=re.M)
     if "concurrency_points" in t else t + "listed:\n- 1\n- ${now:%H}\n", "listed.1"),
])
def test_an_interpolation_in_a_saved_config_is_refused_unresolved(saved_run, tmp_path, monkeypatch, edit, key):
    from kvbench.harness.front.replay import load_config

    monkeypatch.setenv("SECRET_TOKEN", SECRET)
    folder = tampered(saved_run, tmp_path, edit)
    with pytest.raises(ConfigError, match="is an interpolation") as err:
        load_config(folder)
    assert key in str(err.value) and SECRET not in str(err.value) and "\n" not in str(err.value)


def test_a_replayed_secret_reaches_no_row_and_no_output(saved_run, tmp_path):
    folder = tampered(saved_run, tmp_path, lambda t: re.sub(r"^  name: tiny-llama$", "  name: ${oc.env:SECRET_TOKEN}",
                                                            t, flags=re.M))
    out = tmp_path / "out"
    p = replay(str(folder), "--out", str(out), SECRET_TOKEN=SECRET)
    assert p.returncode == 2 and "is an interpolation" in p.stderr and "Traceback" not in p.stderr
    assert SECRET not in p.stdout + p.stderr
    assert not out.exists() or not any(SECRET in f.read_text(errors="ignore") for f in out.rglob("*") if f.is_file())


@pytest.fixture
def booby_trapped(tmp_path) -> tuple[Path, Path]:
    """A package whose import leaves a marker file: what a shared folder's kernel module could do."""
    pkg = tmp_path / "site" / "trap_kernels"
    pkg.mkdir(parents=True)
    marker = tmp_path / "ran.txt"
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    (pkg / "kernel.py").write_text("")
    return tmp_path / "site", marker


@pytest.mark.parametrize("kernel", ["trap_kernels.kernel", "trap_kernels", "unittest.__main__", "os.path",
                                    "kernels.registry.nope", "kernels.csrc"])
def test_a_saved_kernel_module_is_not_imported_without_the_opt_in(saved_run, tmp_path, booby_trapped, monkeypatch, kernel):
    from kvbench.harness.front.replay import load_config

    site, marker = booby_trapped
    monkeypatch.syspath_prepend(str(site))
    folder = tampered(saved_run, tmp_path, lambda t: re.sub(r"^  kernel: .*$", f"  kernel: {kernel}", t, flags=re.M))
    with pytest.raises(ConfigError, match=f"--allow-kernel {re.escape(kernel)}"):
        load_config(folder)
    assert not marker.exists()


def test_the_opt_in_names_the_one_module_it_allows(saved_run, tmp_path, booby_trapped):
    site, marker = booby_trapped
    folder = tampered(saved_run, tmp_path, lambda t: re.sub(r"^  kernel: .*$", "  kernel: trap_kernels.kernel", t,
                                                            flags=re.M))
    out = tmp_path / "out"
    other = replay(str(folder), "--out", str(out), "--allow-kernel", "trap_kernels.other", PYTHONPATH=f"{site}:{REPO_ROOT}")
    assert other.returncode == 2 and not marker.exists()
    allowed = replay(str(folder), "--out", str(out), "--allow-kernel", "trap_kernels.kernel", PYTHONPATH=f"{site}:{REPO_ROOT}")
    assert marker.exists() and "Traceback" not in allowed.stderr  # imported because asked; its row says what failed


def test_kvbench_own_kernels_replay_without_an_opt_in(saved_run, tmp_path):
    from kvbench.harness.front.replay import load_config

    for kernel in ("torch", "triton", "cuda", "kernels.cuda_emulated"):
        folder = tampered(saved_run, tmp_path / kernel, lambda t: re.sub(r"^  kernel: .*$", f"  kernel: {kernel}", t,
                                                                         flags=re.M))
        assert load_config(folder).impl.kernel == kernel


@pytest.mark.parametrize("content, says", [
    ("seed: [1, 2\n", "is not valid YAML at line"),
    ("model:\n\tname: x\n", "is not valid YAML at line"),
    ("- 1\n- 2\n", "holds list, not a kvbench config"),
    ("42\n", "holds int, not a kvbench config"),
    ("", "holds NoneType, not a kvbench config"),
    ("batch: {a: 1}\n", "does not match this kvbench's config schema"),
    ("nope_key: 1\n", "does not match this kvbench's config schema"),
    (b"\xff\xfe\x00bad", "is not UTF-8 text"),
])
def test_every_load_error_is_one_line(tmp_path, content, says):
    from kvbench.harness.front.replay import load_config

    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / "config.yaml"
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    with pytest.raises(ConfigError, match=re.escape(says)) as err:
        load_config(folder)
    assert "\n" not in str(err.value)


def test_a_config_yaml_that_is_a_folder_is_one_line(tmp_path):
    (tmp_path / "run" / "config.yaml").mkdir(parents=True)
    p = replay(str(tmp_path / "run"), "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and "has no config.yaml" in p.stderr and "Traceback" not in p.stderr


def test_a_config_saved_before_gpu_memory_mib_loads_with_the_bytes_it_priced(tmp_path):
    """Published run folders saved ``gpu.memory_gb`` (decimal GB): they load, as the memory_mib of the same bytes."""
    from kvbench.harness.front.replay import load_config

    text = (REPO_ROOT / "results" / "cpu-amd-epyc-2core" / "capacity" / "0" / "config.yaml").read_text()
    assert "\ngpu: null\n" in text
    saved = tmp_path / "old"
    saved.mkdir()
    (saved / "config.yaml").write_text(text.replace("\ngpu: null\n", "\ngpu:\n  name: h100-sxm\n  memory_gb: 80.0\n"))
    cfg = load_config(saved)
    assert cfg.gpu.name == "h100-sxm" and cfg.gpu.memory_mib * 2**20 == pytest.approx(80e9)
