"""The entry point: the completion line a shell sends is read with the aliases argv gets.

The console script and the shell completion themselves run in tests/jobs/test_console_script.py.
"""

from __future__ import annotations

import pytest

from harness.__main__ import completion_line


@pytest.mark.parametrize("line, read", [
    # finished words: rewritten as argv is, so Hydra can compose them and offer the keys
    ("kvbench impl=paged impl.ke", "kvbench +impl=paged impl.ke"),
    ("kvbench max_num_seqs=4 workload.num", "kvbench batch=4 workload.num"),
    ("kvbench request_rate=5 arrival.r", "kvbench arrival=poisson arrival.rate=5 arrival.r"),
    ("kvbench -m impl=a,b batch=1,2 ", "kvbench -m +impl=a,b batch=1,2 "),
    ("python -m harness impl=paged mod", "python -m harness +impl=paged mod"),
    # the word being typed stays as typed (bash keeps the candidates that start with it)
    ("kvbench impl=pa", "kvbench impl=pa"),
    ("kvbench max_num", "kvbench max_num"),
    ("kvbench ", "kvbench "),
    ("kvbench", "kvbench"),
    ("", ""),
])
def test_the_completion_line_reads_aliases_as_argv_does(line, read):
    assert completion_line(line) == read

