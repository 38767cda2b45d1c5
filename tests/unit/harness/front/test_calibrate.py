"""``kvbench calibrate``: the command's refusals, the profile it writes, and a whole fit on "published" files that
kvbench priced itself under known constants (so the answer is known)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from kvbench.harness.__main__ import _run as kvbench
from kvbench.harness.front.calibrate import calibrate, main, profile_text, table
from kvbench.harness.front.calibrate_points import METRIC_KEYS, Setup, read_result, split_points
from kvbench.harness.front.calibrate_price import FITTED, Pricer
from kvbench.harness.serving.engine_profile import EngineSpec
from tests.conftest import REPO_ROOT
from tests.unit.harness.front.test_calibrate_points import SAMPLE, closed_loop

TINY = {"gpu": "l4", "model": "qwen2.5-0.5b"}  # a 0.5B model on an L4: a simulation is start-up, ~2 s
TRUTH = {"frontend_ms": 40.0, "step_overhead_us": 2000.0, "seq_overhead_us": 10.0}


def published(tmp_path, concurrencies: tuple[int, ...]) -> list[Path]:
    """``vllm bench serve`` files of closed loops at ``concurrencies`` whose figures kvbench priced under TRUTH."""
    files, results = [], []
    for c in concurrencies:
        files.append(tmp_path / f"c{c}.json")
        results.append(closed_loop(max_concurrency=c, num_prompts=24, completed=24, total_input_tokens=24 * 128,
                                   total_output_tokens=24 * 24, **{k: 1.0 for k in METRIC_KEYS}))
        files[-1].write_text(json.dumps(results[-1]))
    pricer = Pricer([read_result(f, Setup(**TINY)) for f in files], "vllm_v1")  # the files priced in parallel
    (values,) = pricer.values([[TRUTH[k] for k in FITTED]], range(len(pricer.points)))
    figures = iter(values)
    for path, result in zip(files, results):
        result.update({k: next(figures) for k in METRIC_KEYS})  # a file's points are METRIC_KEYS' order
        path.write_text(json.dumps(result))
    return files


def test_a_fit_recovers_the_constants_that_priced_the_files_and_the_holdout_error_falls(tmp_path, capsys):
    files = published(tmp_path, (1, 16))  # two batch sizes: o and c can be told apart
    out = calibrate(files, {**TINY, "engine": "vllm_v1"}, tmp_path / "mine.yaml", 3, 300, 1)  # one round: 10 runs
    text = capsys.readouterr().out
    conf = OmegaConf.load(out)
    assert conf.name == "mine" and conf.layer_overhead_us == 30 and conf.async_scheduling is False  # the base's
    # The figures are linear in the constants where these runs are: one round lands on them (2026-12-06: exactly)
    assert conf.frontend_ms == pytest.approx(TRUTH["frontend_ms"], rel=0.02)
    assert conf.step_overhead_us == pytest.approx(TRUTH["step_overhead_us"], rel=0.05)
    assert conf.seq_overhead_us == pytest.approx(TRUTH["seq_overhead_us"], abs=2.0)
    holdout = [line for line in text.splitlines() if line.startswith("median |error|, holdout")]
    before, after = (float(w.rstrip("%,")) for w in holdout[0].split() if w.endswith(("%", "%,")))
    assert before > 10.0 and after < 1.0
    assert "c1.json:ttft_ms_mean" in text and "price with it: engine=vllm_v1 engine.frontend_ms=" in text


def test_the_table_gives_each_points_errors_and_the_medians_by_split(tmp_path):
    runs = split_points([read_result(SAMPLE, Setup(gpu="h100-sxm", model="llama-3.1-8b"))], 3)
    pub = np.array([p.value for p in runs[0].points])
    text, summary = table(runs, pub * 1.2, pub * np.array([1.0, 0.9, 1.5, 1.0, 1.0, 1.1, 1.0]))
    assert summary["fit"] == (pytest.approx(20.0), pytest.approx(0.0), 5)
    assert summary["holdout"] == (pytest.approx(20.0), pytest.approx(30.0), 2)  # |+50%| and |+10%|: median 30
    assert "tpot_ms_mean  holdout" in text and "+20.0%" in text and "+50.0%" in text


def test_the_profile_is_the_base_with_the_fitted_values_and_their_own_comments():
    base = (REPO_ROOT / "conf" / "engine" / "vllm_v1.yaml").read_text()
    fitted = {"frontend_ms": 41.5, "step_overhead_us": 1234.5, "seq_overhead_us": 0.0}
    text = profile_text(base, "mine", fitted, {k: f"{k}: fitted to a.json" for k in fitted}, "mine: calibrated")
    conf = OmegaConf.create(text)
    assert (conf.name, conf.frontend_ms, conf.step_overhead_us, conf.seq_overhead_us) == ("mine", 41.5, 1234.5, 0)
    base_conf = OmegaConf.create(base)
    assert all(conf[k] == base_conf[k] for k in base_conf if k not in (*fitted, "name"))
    assert "# frontend_ms: fitted to a.json\nfrontend_ms: 41.5" in text
    assert "Issue 46 (the published-figures comparison)" not in text  # the base value's source went with it
    assert "# layer_overhead_us: assumption" in text  # the kept values keep theirs
    EngineSpec(**{k: conf[k] for k in EngineSpec.field_names() if k in conf})


@pytest.mark.parametrize("argv,message", [
    (["x.json", "gpu=l4"], "model=NAME required"),
    (["gpu=l4", "model=qwen2.5-0.5b"], "no result file named"),
    (["x.json", "gpu=l4", "model=qwen2.5-0.5b", "impl=paged"], "unknown key 'impl'; allowed: gpu, gpu.count, model"),
    (["x.json", "gpu=b300", "model=qwen2.5-0.5b"], "gpu='b300': no conf/gpu/b300.yaml; allowed: a100-40gb"),
    (["x.json", "gpu=l4", "model=qwen2.5-0.5b", "engine=vllm_v9"], "engine='vllm_v9': no conf/engine/vllm_v9.yaml"),
    (["x.json", "gpu=l4", "model=qwen2.5-0.5b", "gpu.count=two"], "gpu.count='two': allowed: a whole number"),
])
def test_a_bad_command_line_is_one_line_and_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvbench calibrate: ") and message in err and err.count("\n") == 1


def test_kvbench_calibrate_is_the_command_and_a_bad_file_stops_it_before_any_simulation(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(closed_loop(request_rate=None)))
    assert kvbench(["calibrate", str(bad), *(f"{k}={v}" for k, v in TINY.items())]) == 2
    assert f"{bad}: request_rate: missing" in capsys.readouterr().err
