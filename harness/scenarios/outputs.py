"""What a job's impls leave besides their rows: the side tables (``requests``, ``steps``, ``points``,
``rate_probes``, ``profile``: name -> DataFrame) and the generated tokens (tokens.jsonl records).
The run folder writes them as each impl finishes (harness/job/folder.py); a resumed job starts from
the ones an earlier attempt kept."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outputs:
    tables: dict = field(default_factory=dict)  # side tables: name -> DataFrame
    tokens: list[dict] = field(default_factory=list)  # tokens.jsonl records
