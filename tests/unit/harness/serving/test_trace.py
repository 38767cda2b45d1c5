"""workload=trace: lengths and arrivals read from CSV, JSONL or parquet, bad files named, end to end."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvbench.harness.config import TraceColumns, WorkloadConfig
from kvbench.harness.scenarios.context import JobContext
from kvbench.harness.errors import ConfigError
from kvbench.harness.front.resolve import resolve
from kvbench.harness.front.job import run_job
from kvbench.harness.serving.workload import draw_workload, workload_digest
from tests.conftest import REPO_ROOT

# Rows out of arrival order on purpose (ties at 3.0 keep file order); renamed columns.
TRACE = pd.DataFrame({
    "ts": [5.0, 1.0, 3.0, 3.0, 9.5],
    "input_tokens": [12, 7, 30, 4, 9],
    "gen_tokens": [3, 5, 2, 6, 1],
    "user": ["a", "b", "c", "d", "e"],
})
RENAMED = TraceColumns(prompt_len="input_tokens", output_len="gen_tokens", arrival_s="ts")


def write(df: pd.DataFrame, path: Path) -> Path:
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(rec) + "\n" for rec in df.to_dict("records")))
    else:
        df.to_parquet(path, index=False)
    return path


def trace_cfg(path: Path, **kw) -> WorkloadConfig:
    return WorkloadConfig(name="trace", distribution="trace", path=str(path), **kw)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_renamed_columns_read_into_requests_in_arrival_order(tmp_path, suffix):
    path = write(TRACE, tmp_path / f"t{suffix}")
    wl = draw_workload(trace_cfg(path, columns=RENAMED), 5, 4096, 1024, seed=0)
    order = [1, 2, 3, 0, 4]  # by ts, stable
    assert [len(r.prompt_ids) for r in wl.requests] == TRACE.input_tokens[order].tolist()
    assert [r.output_len for r in wl.requests] == TRACE.gen_tokens[order].tolist()
    assert [r.request_id for r in wl.requests] == [0, 1, 2, 3, 4]
    assert wl.trace_arrivals == (1.0, 3.0, 3.0, 5.0, 9.5)
    assert wl.trace_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert wl.notes == ()


def test_the_format_does_not_change_the_requests(tmp_path):
    digests = {workload_digest(draw_workload(trace_cfg(write(TRACE, tmp_path / f"t{s}"), columns=RENAMED),
                                             4, 4096, 1024, seed=3).requests) for s in (".csv", ".jsonl", ".parquet")}
    assert len(digests) == 1


def test_head_takes_the_first_rows_and_random_a_seeded_draw(tmp_path):
    df = pd.DataFrame({"prompt_len": np.arange(1, 201), "output_len": np.full(200, 2)})
    path = write(df, tmp_path / "t.csv")
    lens = lambda sample, seed: [len(r.prompt_ids) for r in draw_workload(  # noqa: E731
        trace_cfg(path, sample=sample), 10, 4096, 1024, seed).requests]
    assert lens("head", 0) == lens("head", 5) == list(range(1, 11))
    drawn = lens("random", 0)
    assert drawn == lens("random", 0) != lens("random", 1)
    assert len(set(drawn)) == 10 and drawn == sorted(drawn) and max(drawn) > 10  # distinct rows, in file order
    wl = draw_workload(trace_cfg(path), 10, 4096, 1024, 0)
    assert wl.trace_arrivals is None


def test_over_long_trace_requests_are_clipped_and_counted(tmp_path):
    df = pd.DataFrame({"prompt_len": [10, 80, 40, 5], "output_len": [5, 5, 40, 5]})
    wl = draw_workload(trace_cfg(write(df, tmp_path / "t.csv")), 4, 4096, 64, seed=0)
    assert [(len(r.prompt_ids), r.output_len) for r in wl.requests] == [(10, 5), (63, 1), (40, 24), (5, 5)]
    assert wl.notes == ("2 of 4 requests clipped to max_seq_len=64 (1 with the prompt cut to leave 1 output token)",)


def resolved(compose, tmp_path: Path, *overrides: str):
    return resolve(compose(["model=tiny-llama", "device=cpu", "batch=3", "workload=trace", *overrides]))


def test_resolve_records_the_selected_mean_lengths(compose, tmp_path):
    path = write(TRACE, tmp_path / "t.parquet")
    cfg = resolved(compose, tmp_path, f"workload.path={path}", "workload.columns.prompt_len=input_tokens",
                   "workload.columns.output_len=gen_tokens", "workload.columns.arrival_s=ts", "arrival=trace",
                   "arrival.time_scale=2", "workload.num_requests=3")
    # The first three rows: ts 5, 1, 3 -> in arrival order 1, 3, 5.
    assert (cfg.workload.prompt_len, cfg.workload.output_len) == (round(49 / 3, 2), round(10 / 3, 2))
    ctx = JobContext(cfg, tmp_path, fingerprint=None)
    assert [r.arrival_s for r in ctx.workload.requests] == [0.0, 4.0, 8.0]  # (ts - 1) * 2
    assert [len(r.prompt_ids) for r in ctx.workload.requests] == [7, 30, 12]


def lengths(prompt, output, **more) -> pd.DataFrame:
    return pd.DataFrame({"prompt_len": prompt, "output_len": output, **more})


BAD_FILES = {
    "zero.csv": (lengths([3, 0], [2, 2]),
                 "workload.columns.prompt_len='prompt_len' must hold whole token counts from 1 to 2147483647; row 2"),
    "negative.csv": (lengths([3, 4], [2, -1]),
                     "workload.columns.output_len='output_len' must hold whole token counts from 1 to"),
    "half.csv": (lengths([3, 4.5], [2, 2]), "workload.columns.prompt_len"),
    "words.jsonl": (lengths([3, 4], ["2", "many"]),
                    "workload.columns.output_len='output_len' must hold numbers; row 2"),
    "gap.csv": (lengths([3, None], [2, 2]), "workload.columns.prompt_len='prompt_len' must hold numbers"),
    "times.parquet": (lengths([3, 4], [2, 2], arrival_s=["0", "later"]),
                      "workload.columns.arrival_s='arrival_s' must hold numbers"),
    # Beyond int64 or int32: refused on the file's value, never cast (1e30 wrapped to -4.6e18 before).
    "huge.csv": (lengths([3, 1e30], [2, 2]), "from 1 to 2147483647; row 2 of workload.path="),
    "bigint.csv": (lengths([3, 99999999999999999999], [2, 2]), "from 1 to 2147483647; row 2"),
    "int64.jsonl": (lengths([3, 2**62], [2, 2]), "from 1 to 2147483647; row 2"),
    "infinite.csv": (lengths([3, float("inf")], [2, 2]), "must hold numbers; row 2"),
    "late.csv": (lengths([3, 4], [2, 2], arrival_s=[0.0, 1e30]), "workload.columns.arrival_s='arrival_s' must hold seconds"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_bad_trace_file_is_a_config_error_naming_the_key(compose, tmp_path, name):
    df, expected = BAD_FILES[name]
    path = write(df, tmp_path / name)
    with pytest.raises(ConfigError) as err:
        resolved(compose, tmp_path, f"workload.path={path}")
    assert expected in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides, count", [([], 5), (["workload.num_requests=3"], 3),
                                             (["workload.num_requests=3", "workload.sample=random"], 3)])
def test_num_requests_defaults_to_every_row_of_the_trace(compose, tmp_path, overrides, count):
    """Not to batch (3 here, 8 by default: a 2-row trace was an error); an explicit count still wins."""
    path = write(TRACE, tmp_path / "t.csv")
    cfg = resolved(compose, tmp_path, f"workload.path={path}", "workload.columns.prompt_len=input_tokens",
                   "workload.columns.output_len=gen_tokens", *overrides)
    assert cfg.workload.num_requests == count and cfg.batch == 3
    ctx = JobContext(cfg, tmp_path, fingerprint=None)
    assert len(ctx.workload.requests) == count
    if not overrides:
        assert sorted(len(r.prompt_ids) for r in ctx.workload.requests) == sorted(TRACE.input_tokens)
        assert cfg.workload.prompt_len == round(TRACE.input_tokens.mean(), 2)


def test_two_rows_run_with_the_default_batch(compose, tmp_path):
    path = write(lengths([12, 7], [3, 2]), tmp_path / "t.csv")
    (row,), code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "model=tiny-llama", "device=cpu",
                                    "max_seq_len=64", "workload=trace", f"workload.path={path}",
                                    "scenario.concurrency_points=[1,2]"]), tmp_path / "run")
    assert code == 0, row.get("error")
    assert row["num_requests"] == 2 and row["batch"] == 8 and row["output_tokens"] == 5


def test_an_explicit_num_requests_beyond_the_rows_is_a_config_error(compose, tmp_path):
    path = write(lengths([3, 4], [2, 2]), tmp_path / "short.csv")
    with pytest.raises(ConfigError) as err:
        resolved(compose, tmp_path, f"workload.path={path}", "workload.num_requests=3")
    assert "workload.num_requests: 3 requests asked for" in str(err.value) and "has 2 rows" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_trace_without_rows_is_a_config_error(compose, tmp_path):
    path = write(lengths([], []), tmp_path / "empty.csv")
    with pytest.raises(ConfigError, match="has no rows: a trace needs at least one request"):
        resolved(compose, tmp_path, f"workload.path={path}")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], "workload.path must name a CSV, JSONL or parquet file"),
        (["workload.path=/nonexistent/trace.csv"], "workload.path='/nonexistent/trace.csv': no such file"),
        (["workload.path=TRACE.txt"], "has an unknown file type '.txt'; allowed: .csv, .jsonl, .parquet"),
        (["workload.path=TRACE.csv", "workload.columns.prompt_len=tokens_in"],
         "workload.columns.prompt_len='tokens_in' is not a column"),
        (["workload.path=TRACE.csv", "arrival=trace"], "workload.columns.arrival_s='arrival_s' column"),
        (["workload.path=TRACE.csv", "workload.sample=middle"],
         "workload.sample='middle' is not allowed; allowed: head, random"),
        (["workload=chat", "workload.path=TRACE.csv"], "workload.path="),
        (["workload=chat", "arrival=trace"], "arrival=trace needs arrival times"),
    ],
)
def test_bad_trace_keys_are_config_errors_naming_the_key(compose, tmp_path, overrides, expected):
    write(lengths([3, 4, 5], [2, 2, 2]), tmp_path / "TRACE.csv")
    (tmp_path / "TRACE.txt").write_text("prompt_len,output_len\n3,2\n")
    overrides = [o.replace("TRACE", str(tmp_path / "TRACE")) for o in overrides]
    with pytest.raises(ConfigError) as err:
        resolved(compose, tmp_path, *overrides)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_capacity_rows_note_the_clipped_requests(compose, tmp_path):
    path = write(pd.DataFrame({"prompt_len": [10, 90, 20, 30], "output_len": [5, 5, 80, 5]}), tmp_path / "t.csv")
    rows, code = run_job(compose(["+impl=paged_torch", "scenario=capacity", "model=tiny-llama", "device=cpu",
                                  "max_seq_len=64", "batch=4", "workload=trace", f"workload.path={path}",
                                  "scenario.concurrency_points=[1,4]"]), tmp_path / "run")
    assert code == 0, rows[0].get("error")
    assert rows[0]["trace_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "2 of 4 requests clipped to max_seq_len=64" in rows[0]["notes"]


def harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ})


CLI = ["+impl=paged_torch", "model=tiny-llama", "device=cpu", "max_seq_len=64", "batch=2", "scenario.warmup=0",
       "workload=trace", "workload.columns.prompt_len=input_tokens", "workload.columns.output_len=gen_tokens"]


def test_cli_runs_a_trace_with_its_arrivals(tmp_path):
    path = write(pd.DataFrame({"input_tokens": [12, 70, 9], "gen_tokens": [4, 3, 5], "t": [0.0, 0.01, 0.02]}),
                 tmp_path / "t.jsonl")
    out = tmp_path / "run"
    p = harness(*CLI, f"workload.path={path}", "workload.columns.arrival_s=t", "arrival=trace",
                "arrival.time_scale=0.5", f"hydra.run.dir={out}")
    assert p.returncode == 0, p.stderr
    row = pd.read_csv(out / "rows.csv").iloc[0]
    assert row.status == "ok" and row.workload == "trace" and row.num_requests == 3  # every row, not batch=2
    assert row.trace_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "1 of 3 requests clipped to max_seq_len=64" in row.notes
    tokens = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    assert [len(t["prompt_ids"]) for t in tokens] == [12, 63, 9]


def test_cli_bad_trace_exits_2_with_an_error_row(tmp_path):
    path = write(pd.DataFrame({"input_tokens": [12, 7], "gen_tokens": [4, 3]}), tmp_path / "t.csv")
    p = harness(*CLI, f"workload.path={path}", "arrival=trace", f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "workload.columns.arrival_s" in p.stderr
    row = pd.read_csv(tmp_path / "run" / "rows.csv").iloc[0]
    assert row.status == "error" and "workload.columns.arrival_s" in row.error


# ---- format=mooncake: hash_ids of 512-token blocks (here smaller), timestamps in ms ----------------------

MOONCAKE = [
    {"timestamp": 2000, "input_length": 20, "output_length": 3, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 17, "output_length": 2, "hash_ids": [0, 1, 5]},
    {"timestamp": 500, "input_length": 6, "output_length": 4, "hash_ids": [7]},
]


def mooncake_cfg(path: Path, **kw) -> WorkloadConfig:
    cols = TraceColumns(prompt_len="input_length", output_len="output_length", arrival_s="timestamp")
    return WorkloadConfig(name="mooncake", distribution="trace", format="mooncake", path=str(path),
                          hash_block_size=8, columns=cols, **kw)


def write_jsonl(records, path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_mooncake_equal_hash_ids_give_equal_tokens_and_ms_become_seconds(tmp_path):
    path = write_jsonl(MOONCAKE, tmp_path / "m.jsonl")
    wl = draw_workload(mooncake_cfg(path), 3, 32000, 1024, seed=0)
    a, b, c = wl.requests  # arrival order: rows 2, 3, 1
    assert wl.trace_arrivals == (0.0, 0.5, 2.0)
    assert [len(r.prompt_ids) for r in wl.requests] == [17, 6, 20]
    assert a.prompt_ids[:16] == c.prompt_ids[:16]  # hash ids 0, 1 shared
    assert a.prompt_ids[16] != c.prompt_ids[16]  # 5 against 2
    assert b.prompt_ids != c.prompt_ids[:6]
    # the same file read again, or with another cache block size, draws the same tokens; another seed others
    assert workload_digest(draw_workload(mooncake_cfg(path), 3, 32000, 1024, 0).requests) == workload_digest(wl.requests)
    assert workload_digest(draw_workload(mooncake_cfg(path), 3, 32000, 1024, 1).requests) != workload_digest(wl.requests)


def test_mooncake_parquet_and_a_renamed_hash_column(tmp_path):
    df = pd.DataFrame(MOONCAKE).rename(columns={"hash_ids": "blocks"})
    path = write(df, tmp_path / "m.parquet")
    cfg = mooncake_cfg(path)
    cfg.columns.hash_ids = "blocks"
    wl = draw_workload(cfg, 3, 32000, 1024, seed=0)
    jsonl = draw_workload(mooncake_cfg(write_jsonl(MOONCAKE, tmp_path / "m.jsonl")), 3, 32000, 1024, seed=0)
    assert workload_digest(wl.requests) == workload_digest(jsonl.requests)


@pytest.mark.parametrize("records, column, expected", [
    (MOONCAKE, "blocks", "workload.columns.hash_ids='blocks' is not a column"),
    ([{**MOONCAKE[0], "hash_ids": [1, -2]}], "hash_ids", "lists of whole ids >= 0"),
    ([{**MOONCAKE[0], "hash_ids": "1,2"}], "hash_ids", "row 1 of workload.path="),
])
def test_bad_mooncake_hash_ids_are_config_errors(tmp_path, records, column, expected):
    cfg = mooncake_cfg(write_jsonl(records, tmp_path / "m.jsonl"))
    cfg.columns.hash_ids = column
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        draw_workload(cfg, len(records), 32000, 1024, seed=0)


def test_the_shipped_mooncake_trace_reads(compose, tmp_path):
    """The release's synthetic trace (conf/traces/, in the checkout: never skipped), first rows: prompts as long as
    the file says, sharing the blocks its hash ids share."""
    shared = REPO_ROOT / "conf" / "traces" / "mooncake_synthetic_trace.jsonl"
    cfg = resolve(compose(["model=tiny-llama", "device=cpu", "workload=mooncake", f"workload.path={shared}",
                           "workload.num_requests=20", "max_seq_len=131072", "arrival=trace"]))
    lines = [json.loads(line) for line in shared.read_text().splitlines()[:20]]
    ctx = JobContext(cfg, tmp_path, fingerprint=None)
    assert sorted(len(r.prompt_ids) for r in ctx.workload.requests) == sorted(r["input_length"] for r in lines)
    assert cfg.workload.format == "mooncake" and cfg.workload.hash_block_size == 512
