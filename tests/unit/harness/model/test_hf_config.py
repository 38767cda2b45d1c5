"""config.json's numbers are taken as they are: a malformed field is one line naming it, never a cast or a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from tests.conftest import REPO_ROOT

GOOD = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, max_position_embeddings=256)


def folder_with(tmp_path: Path, raw) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def test_a_good_config_reads(tmp_path):
    cfg = resolve_model_config(ModelConfig(path=str(folder_with(tmp_path, GOOD))))
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (32, 2, 1, 16)


@pytest.mark.parametrize("key, value", [
    (key, value)
    for key in ("hidden_size", "vocab_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings")
    for value in (256.7, 32.0, "abc", "32", [32], {"n": 32}, True, 0, -4, 1e30, 2**40)
] + [("rms_norm_eps", v) for v in ("abc", None, [1e-5], True, -1.0, float("inf"))]
  + [("rope_theta", v) for v in ("abc", [1.0], 0)]
  + [("attention_bias", v) for v in ("yes", 1, None)]
  + [("tie_word_embeddings", v) for v in ("no", 0)])
def test_a_malformed_field_is_one_line_naming_it(tmp_path, key, value):
    raw = {**GOOD, key: value}
    if value is None and key in ("num_key_value_heads", "head_dim", "max_position_embeddings"):
        pytest.skip("null means 'not set' for these (HF writes head_dim: null)")
    with pytest.raises(ConfigError) as err:
        resolve_model_config(ModelConfig(path=str(folder_with(tmp_path, raw))))
    message = str(err.value)
    assert key in message and "\n" not in message  # named as config.json's key, or as the model.* key it becomes


@pytest.mark.parametrize("raw, says", [
    ([1, 2], "holds list, not an object"),
    ("llama", "holds str, not an object"),
    ({k: v for k, v in GOOD.items() if k != "hidden_size"}, "lacks 'hidden_size'"),
    ({**GOOD, "rope_scaling": {"rope_type": "llama3", "factor": "x", "low_freq_factor": 1, "high_freq_factor": 4,
                               "original_max_position_embeddings": 64}}, "rope scaling factor='x'"),
])
def test_a_malformed_file_is_one_line(tmp_path, raw, says):
    with pytest.raises(ConfigError, match=says):
        resolve_model_config(ModelConfig(path=str(folder_with(tmp_path, raw))))


def test_the_cli_gives_exit_2_and_an_error_row(tmp_path):
    """In a run (and in each job of a sweep) the folder gets its error row; 256.7 never becomes 256."""
    folder = folder_with(tmp_path, {**GOOD, "hidden_size": 256.7})
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "harness", "+impl=paged_torch", f"model.path={folder}",
                        f"hydra.run.dir={run}", "hydra/job_logging=disabled"], cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "hidden_size=256.7" in p.stderr
    row = pd.read_parquet(run / "rows.parquet").iloc[0]
    assert row.status == "error" and "hidden_size=256.7" in row.error
