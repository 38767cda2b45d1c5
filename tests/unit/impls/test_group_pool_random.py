"""GroupedBlockPool under random operations as a scheduler drives it: admissions with and without shared
prefixes (whole prompts, or first chunks grown chunk by chunk), decode appends, forks, releases and preemptions,
on Gemma's 5:1 layout (a window that is no multiple of the block size), gpt-oss's 1:1 and split pools, with
prefix caching on and off. After every operation the pool's invariants hold (impls/group_checks.py), a sliding
group holds at most ``ceil((window - 1 + chunk) / block_size) + 1`` blocks of a sequence, every position a query
can still read is in a live block, and a prefix hit is the longest one every group serves (a brute-force search)
and holds exactly the tokens written before under that prefix."""

from __future__ import annotations

import random

import pytest

from kvbench.impls.attention_kinds import FullAttention, SlidingWindow
from kvbench.impls.group_pool import NULL, GroupedBlockPool, PoolGroup
from kvbench.impls.prefix_chain import _ROOT_HASH, chain_hash

BS = 4
# Gemma 3: five sliding layers to a full one, cut in groups of the full kind's count (a padded last group).
GEMMA = ([PoolGroup(FullAttention(), 2, 2, 0)] + [PoolGroup(SlidingWindow(10), 2, 2, 0)] * 4
         + [PoolGroup(SlidingWindow(10), 1, 2, 0)], [160])
GPT_OSS = ([PoolGroup(SlidingWindow(7), 3, 3, 0), PoolGroup(FullAttention(), 3, 3, 0)], [70])
SPLIT = ([PoolGroup(FullAttention(), 2, 2, 0), PoolGroup(SlidingWindow(6), 5, 5, 1)], [40, 30])
LAYOUTS = {"gemma": GEMMA, "gpt_oss": GPT_OSS, "split": SPLIT}


def brute_force_hit(pool: GroupedBlockPool, prompt: list[int]) -> int:
    """The longest hit, in blocks, by asking every candidate point from the longest down."""
    n_full = len(prompt) // BS
    n_lookup = n_full - 1 if n_full * BS == len(prompt) else n_full
    hashes, h = [], _ROOT_HASH
    for i in range(n_lookup):
        h = chain_hash(h, tuple(prompt[i * BS:(i + 1) * BS]))
        hashes.append(h)

    def cached(g: int, i: int) -> bool:
        p = pool.pools[pool.groups[g].pool]
        b = p.by_key.get((g, hashes[i]))
        return b is not None and p.key[b][2] == tuple(prompt[i * BS:(i + 1) * BS])

    for hit in range(n_lookup, 0, -1):
        if all(cached(g, i) for g, group in enumerate(pool.groups)
               for i in range(group.kind.first_needed_block(hit * BS, BS), hit)):
            return hit
    return 0


class Driver:
    """A pool and the scheduler's view of its sequences: each one's prompt, how far it is written, its chunk."""

    def __init__(self, layout, prefix_caching: bool, seed: int) -> None:
        groups, pools = layout
        self.pool = GroupedBlockPool(pools, BS, groups, prefix_caching=prefix_caching)
        self.rng = random.Random(seed)
        self.prefixes = [[self.rng.randrange(9) for _ in range(self.rng.randint(4, 30))] for _ in range(3)]
        self.prompts: dict[int, list[int]] = {}
        self.chunk: dict[int, int] = {}  # seq -> the longest write it made (what its sliding groups may hold)
        self.written: set[tuple[int, ...]] = set()  # every block-aligned prefix any sequence wrote
        self.next_id = 0

    def prefilling(self) -> list[int]:
        return [s for s in self.pool.tables if self.pool.num_tokens(s) < len(self.prompts[s])]

    def _note_written(self, seq: int) -> None:
        toks = self.prompts[seq][:self.pool.num_tokens(seq)] if seq in self.prompts else []
        for k in range(BS, len(toks) + 1, BS):
            self.written.add(tuple(toks[:k]))

    def admit(self) -> None:
        rng = self.rng
        prompt = (rng.choice(self.prefixes) if rng.random() < 0.7 else []) + [rng.randrange(9)
                                                                              for _ in range(rng.randint(1, 14))]
        chunk = rng.choice([None, 3, 5, 8])
        plan = self.pool.plan_admit(prompt, chunk_tokens=chunk)
        if self.pool.prefix_caching:
            assert plan.cached_tokens == brute_force_hit(self.pool, prompt) * BS
            assert plan.cached_tokens == 0 or tuple(prompt[:plan.cached_tokens]) in self.written
        else:
            assert plan.cached_tokens == 0
        if not plan.fits:
            return
        seq = self.next_id
        self.next_id += 1
        self.prompts[seq] = prompt
        assert self.pool.admit(seq, plan) == plan.cached_tokens
        self.chunk[seq] = self.pool.num_tokens(seq) - plan.cached_tokens
        self._note_written(seq)

    def grow(self, seq: int) -> None:
        """The next chunk of a prefill under way (nothing changes when its blocks are not free)."""
        n, size = self.pool.num_tokens(seq), self.rng.choice([1, 3, 5, 8])
        tokens = self.prompts[seq][n:n + size]
        if self.pool.try_append(seq, tokens) is not None:
            self.chunk[seq] = max(self.chunk[seq], len(tokens))
            self._note_written(seq)

    def decode(self, seq: int) -> None:
        k = self.rng.choice([1, 1, 1, 3])  # a ride's owed tokens come in one call
        tokens = [self.rng.randrange(9) for _ in range(k)]
        before = self.pool.usage()
        if self.pool.try_append(seq, tokens) is None:
            assert self.pool.usage() == before and not self.pool.can_append(seq, k)
            return
        self.prompts[seq] = self.prompts[seq] + tokens
        self.chunk[seq] = max(self.chunk[seq], k)
        self._note_written(seq)

    def fork(self, parent: int) -> None:
        self.pool.fork(parent, self.next_id)
        self.prompts[self.next_id], self.chunk[self.next_id] = list(self.prompts[parent]), self.chunk[parent]
        self.next_id += 1

    def leave(self, seq: int, preempted: bool) -> None:
        if preempted:  # a prefill under way leaves its unwritten blocks out of the prefix cache first
            self.pool.drop_unwritten(seq, self.pool.num_tokens(seq))
        self.pool.release(seq)
        del self.prompts[seq], self.chunk[seq]

    def check(self) -> None:
        pool = self.pool
        pool.check_invariants()
        for seq, tables in pool.tables.items():
            n = pool.num_tokens(seq)
            for g, (group, table) in enumerate(zip(pool.groups, tables)):
                live = len(table) - table.count(NULL)
                window = group.kind.window
                if window is not None:
                    assert live <= -(-(window - 1 + self.chunk[seq]) // BS) + 1
                # the next query (at position n) reads these; the last written one is this sequence's own
                first = 0 if window is None else max(0, n - window + 1)
                if n:
                    pool.group_slots(seq, g, first, n)


def step(d: Driver, ops: int) -> None:
    for _ in range(ops):
        r, live = d.rng.random(), list(d.pool.tables)
        growing = d.prefilling()
        done = [s for s in live if s not in growing]
        if r < 0.25 or not live:
            d.admit()
        elif r < 0.45 and growing:
            d.grow(d.rng.choice(growing))
        elif r < 0.75 and done:
            d.decode(d.rng.choice(done))
        elif r < 0.8 and done:
            d.fork(d.rng.choice(done))
        elif r < 0.9 and growing:
            d.leave(d.rng.choice(growing), preempted=True)
        else:
            d.leave(d.rng.choice(live), preempted=False)
        d.check()


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_random_operations_keep_the_invariants(layout, prefix_caching, seed):
    d = Driver(LAYOUTS[layout], prefix_caching, seed)
    step(d, 300)
    if prefix_caching and layout != "split":  # shared prefixes did hit (a burst of them, on a busy pool)
        assert d.pool.cache_hit_tokens > 0
    for seq in list(d.pool.tables):
        d.leave(seq, preempted=False)
    d.check()
    u = d.pool.usage()
    assert u.reserved_tokens == 0 and u.used_tokens == 0 and u.free_tokens == u.pool_tokens
