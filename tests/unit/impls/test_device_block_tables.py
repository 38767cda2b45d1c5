"""DeviceBlockTables: the incrementally updated tensor always equals the BlockManager's tables."""

from __future__ import annotations

import random

import pytest
import torch

from kvbench.impls.block_manager import BlockManager
from kvbench.impls.device_block_tables import DeviceBlockTables
from kvbench.impls.staging import StagingBuffer

CPU = torch.device("cpu")


def device_step(dbt: DeviceBlockTables, bm: BlockManager, batch: list[int]) -> tuple[torch.Tensor, int]:
    """One decode step's table update, as PagedCache does it; returns the tables and the entries sent."""
    staging = StagingBuffer(CPU)
    staged = dbt.stage(batch, [bm.block_table(s) for s in batch], bm.table_changes(), staging)
    staging.upload()
    return dbt.apply(staged, staging), staging[staged.positions].numel()


@pytest.mark.parametrize("seed", range(8))
def test_matches_the_allocator_under_random_admit_append_fork_release_preempt(seed):
    rng = random.Random(seed)
    bm = BlockManager(48, rng.choice([1, 2, 4]))
    dbt = DeviceBlockTables(CPU, rows=2, cols=2)  # tiny, so it must grow
    live: list[int] = []
    preempted: list[tuple[int, list[int]]] = []  # (sequence, its tokens), to re-admit under the same id
    next_id = 0

    def prompt() -> list[int]:  # a small vocabulary, so prefixes repeat and hit the cache
        return [rng.randrange(3) for _ in range(rng.randint(1, 12))]

    for _ in range(300):
        op = rng.random()
        if op < 0.15 and bm.can_admit(toks := prompt()):
            bm.admit(next_id, bm.plan_admit(toks))
            live.append(next_id)
            next_id += 1
        elif op < 0.25 and live:  # a parallel sample: shares every block, copy-on-write later
            bm.fork(rng.choice(live), next_id)
            live.append(next_id)
            next_id += 1
        elif op < 0.35 and live:  # finished
            sid = live.pop(rng.randrange(len(live)))
            bm.release(sid)
        elif op < 0.45 and live:  # preempted, re-admitted (same id, new table) when it fits again
            sid = live.pop(rng.randrange(len(live)))
            preempted.append((sid, list(bm.tokens[sid])))
            bm.release(sid)
        for sid, toks in list(preempted):
            if bm.can_admit(toks):
                bm.admit(sid, bm.plan_admit(toks))
                live.append(sid)
                preempted.remove((sid, toks))
        for sid in list(live):  # the decode step's appends (new blocks, copy-on-write)
            if bm.can_append(sid):
                bm.append(sid, [rng.randrange(3)])
            else:
                live.remove(sid)
                preempted.append((sid, list(bm.tokens[sid])))
                bm.release(sid)
        bm.check_invariants()
        if not live:
            continue
        # Any order; now and then a sequence sits a step out (it loses its row, then gets a new one).
        batch = rng.sample(live, k=len(live) if rng.random() < 0.8 else rng.randint(1, len(live)))
        tables, _ = device_step(dbt, bm, batch)
        for i, sid in enumerate(batch):
            table = bm.block_table(sid)
            assert tables[i, : len(table)].tolist() == table, (sid, table)


def test_only_changed_entries_travel():
    bm = BlockManager(32, 4)
    dbt = DeviceBlockTables(CPU)
    bm.admit(0, bm.plan_admit(list(range(6))))  # 2 blocks
    bm.admit(1, bm.plan_admit(list(range(10, 13))))  # 1 block
    assert device_step(dbt, bm, [0, 1])[1] == 3  # new sequences: whole tables
    bm.append(0, [6])
    bm.append(1, [13])  # both fill their last block: no table changes
    assert device_step(dbt, bm, [0, 1])[1] == 0
    bm.append(1, [14])  # a new block for sequence 1
    bm.fork(0, 2)  # a new table of 2 entries
    bm.append(0, [7])  # into the partly filled block it now shares with 2: copy-on-write
    tables, sent = device_step(dbt, bm, [0, 1, 2])
    assert sent == 1 + 1 + 2
    assert [tables[i, : len(bm.block_table(s))].tolist() for i, s in enumerate([0, 1, 2])] == [
        bm.block_table(s) for s in (0, 1, 2)]
