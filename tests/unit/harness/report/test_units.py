"""A column of milliseconds is shown in the unit a person reads: ms, s or min, by its largest value."""

import pandas as pd

from kvbench.harness.report.units import duration_unit, readable_durations


def test_each_column_gets_the_unit_its_largest_value_reads_in():
    assert duration_unit(pd.Series([12.0, 900.0])) == ("ms", 1.0)
    assert duration_unit(pd.Series([12.0, 45_000.0])) == ("s", 1_000.0)
    assert duration_unit(pd.Series([1.36e6, 2_000.0])) == ("min", 60_000.0)
    assert duration_unit(pd.Series([None, None], dtype=float)) == ("ms", 1.0)


def test_readable_durations_scales_only_millisecond_columns_and_says_the_unit():
    df = pd.DataFrame({"ttft_ms_p99": [1.36e6, 6.0e5], "tpot_ms_p99": [20.0, 30.0], "batch": [8, 16]})
    shown, headers = readable_durations(df, {"ttft_ms_p99": "TTFT p99 ms", "tpot_ms_p99": "TPOT p99 ms",
                                             "batch": "batch"})
    assert headers == {"ttft_ms_p99": "TTFT p99 min", "tpot_ms_p99": "TPOT p99 ms", "batch": "batch"}
    assert shown["ttft_ms_p99"].round(2).tolist() == [22.67, 10.0]
    assert shown["tpot_ms_p99"].tolist() == [20.0, 30.0] and df["ttft_ms_p99"].iloc[0] == 1.36e6  # input kept
