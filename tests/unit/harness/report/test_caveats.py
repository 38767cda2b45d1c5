"""Rows to weigh with care: flagged rows are marked in the tables and said to be drawn, not dropped."""

from __future__ import annotations

import pandas as pd

from kvbench.harness.report.caveats import contended_section, mark_flagged
from kvbench.harness.report.page_one import FLAG
from kvbench.harness.report.palette import FLAGGED_LABEL


def test_a_flagged_rows_impl_is_marked_and_the_others_are_not():
    t = pd.DataFrame({"impl": ["contiguous", "paged_torch", "paged_cuda"],
                      "contended": pd.array([True, False, None], dtype="boolean")})
    assert list(mark_flagged(t)["impl"]) == [f"contiguous{FLAG}", "paged_torch", "paged_cuda"]
    plain = pd.DataFrame({"impl": ["contiguous"]})
    assert mark_flagged(plain) is plain  # rows from before the column: nothing to mark


def test_the_contended_section_says_the_rows_are_drawn_and_how_they_are_marked():
    rows = pd.DataFrame({"run_dir": ["r/0", "r/1"], "scenario": "decode", "impl": ["contiguous", "paged_torch"],
                         "batch": 8, "contended": [True, False], "cpu_util": [0.4, 1.9]})
    text = "\n".join(contended_section(rows))
    assert "1 rows were measured" in text and f'"{FLAGGED_LABEL}"' in text and "drawn like the others" in text
    assert "left out" not in text and "r/0" in text and "r/1" not in text
    assert contended_section(rows.assign(contended=False)) == []
