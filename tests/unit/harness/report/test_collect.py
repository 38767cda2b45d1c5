"""collect: run folders' tables joined into one frame each."""

import pandas as pd


def test_concat_keeps_every_row_in_order_across_column_sets():
    """Frames are joined set of columns by set of columns (faster), then put back in their order: the result
    equals one plain concatenation of them all, values and types."""
    import random

    from harness.report.collect import concat, numeric

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
