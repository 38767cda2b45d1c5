"""collect: run folders' tables joined into one frame each."""

import pandas as pd


def test_concat_keeps_every_row_in_order_across_column_sets():
    """Frames are joined set of columns by set of columns (faster), then put back in their order: the result
    equals one plain concatenation of them all, values and types."""
    import random

    from kvbench.harness.report.collect import concat, numeric

    rng = random.Random(7)
    shapes = [("scenario", "status", "wall_s"), ("scenario", "status", "batch", "notes"), ("status", "batch")]
    frames = []
    for i in range(40):
        cols = shapes[rng.randrange(len(shapes))]
        n = rng.randint(1, 3)
        data = {c: ([f"{c}{i}"] * n if c in ("scenario", "status", "notes") else [i + 0.5 * k for k in range(n)])
                for c in cols}
        if "notes" in cols and i % 2:
            data["notes"] = [None] * n  # an all-empty column in this frame: dropped, then typed at the end
        frames.append(pd.DataFrame(data).assign(run_dir=f"r{i}"))
    got = concat(frames, ["run_dir", "scenario"])
    plain = pd.concat([f.dropna(axis=1, how="all") for f in frames], ignore_index=True, sort=False)
    expected = numeric(plain.reindex(columns=list(got.columns)))
    pd.testing.assert_frame_equal(got, expected)
    assert list(got["run_dir"]) == [f"r{i}" for i, f in enumerate(frames) for _ in range(len(f))]


# What pandas' read_csv takes for a missing value or a boolean (a column of True/False is read as bool, a number)
_PANDAS_NA = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>", "N/A",
              "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}
_PANDAS_BOOL = {"True", "False", "TRUE", "FALSE", "true", "false"}


def _is_text(value: str) -> bool:
    """A cell pandas would keep as text: neither missing, a boolean, nor a number."""
    if value in _PANDAS_NA or value in _PANDAS_BOOL:
        return False
    try:
        float(value)
    except ValueError:
        return True
    return False


def test_published_text_metrics_survive_numeric():
    """Every metric a published row writes as text (results/*/.../rows.csv: git keeps the CSV) is declared text, so
    that collecting it into all_runs keeps its values instead of coercing them to NaN as numbers."""
    from pathlib import Path

    from kvbench.harness.report.collect import numeric
    from kvbench.harness.results import METRICS, TEXT_METRICS

    import csv

    root = Path(__file__).resolve().parents[4] / "results"
    seen: dict[str, str] = {}
    for f in sorted(root.glob("*/*/*/rows.csv")):  # the csv module: pandas took 25 s for the ~500 small files
        with open(f, newline="") as fh:
            for row in csv.DictReader(fh):
                for name in METRICS:
                    if name not in seen and name in row and _is_text(row[name]):
                        seen[name] = str(f)
    assert seen, "no published rows with text metrics found"
    undeclared = {k: v for k, v in seen.items() if k not in TEXT_METRICS}
    assert not undeclared, f"text metrics not in harness.results.TEXT_METRICS: {undeclared}"
    kept = numeric(pd.DataFrame({k: ["x"] for k in seen}))
    assert (kept.iloc[0] == "x").all()
