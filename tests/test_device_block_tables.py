"""DeviceBlockTables: the incrementally updated tensor always equals the Python tables."""

from __future__ import annotations

import random

import pytest

from impls.device_block_tables import DeviceBlockTables


@pytest.mark.parametrize("seed", range(5))
def test_matches_python_tables_under_random_edits(seed):
    rng = random.Random(seed)
    dbt = DeviceBlockTables("cpu", rows=2, cols=2)  # tiny, so it must grow
    tables: dict[int, list[int]] = {}
    next_id = 0
    for _ in range(300):
        op = rng.random()
        if op < 0.2 or not tables:
            tables[next_id] = [rng.randrange(1000) for _ in range(rng.randint(1, 6))]
            next_id += 1
        elif op < 0.3:  # a released sequence, or one re-admitted under the same id with a new table
            sid = rng.choice(list(tables))
            if rng.random() < 0.5:
                del tables[sid]
            else:
                tables[sid] = [rng.randrange(1000) for _ in range(rng.randint(1, 6))]
        for t in tables.values():  # a decode step: some grow, some copy-on-write their last block
            r = rng.random()
            if r < 0.3:
                t.append(rng.randrange(1000))
            elif r < 0.4:
                t[-1] = rng.randrange(1000)
        if not tables:
            continue
        ids = rng.sample(list(tables), k=len(tables))
        out = dbt.gather(ids, [tables[s] for s in ids])
        for i, sid in enumerate(ids):
            assert out[i, : len(tables[sid])].tolist() == tables[sid]
