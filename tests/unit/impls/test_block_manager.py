"""BlockManager: randomized operation sequences with the invariants checked after each."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvbench.impls.block_admission
import kvbench.impls.prefix_chain
from kvbench.impls.allocator import StalePlanError
from kvbench.impls.block_manager import BlockManager
from kvbench.impls.eviction import POLICIES
from kvbench.impls.fast_path import FastPath


def _prompt(rng: random.Random, prefix: list[int]) -> list[int]:
    return prefix[: rng.randint(0, len(prefix))] + [rng.randrange(50) for _ in range(rng.randint(1, 40))]


def _run_ops(seed: int, num_blocks: int, block_size: int, caching: bool, steps: int, eviction: str = "lru",
             host_blocks: int = 0) -> None:
    rng = random.Random(seed)
    bm = BlockManager(num_blocks, block_size, prefix_caching=caching, eviction=eviction, host_blocks=host_blocks)
    prefix = [rng.randrange(50) for _ in range(3 * block_size)]  # shared prompts make prefix hits
    live: list[int] = []
    next_id = 0
    old_plan = None  # a plan kept past a change of state: admitting it must raise
    for _ in range(steps):
        op = rng.choice(["admit", "admit", "append", "append", "append", "fork", "release", "preempt"])
        if op == "admit":
            prompt = _prompt(rng, prefix)
            plan = bm.plan_admit(prompt)
            assert plan.fits == (plan.new_blocks <= bm.num_free_blocks) == bm.can_admit(prompt)
            if old_plan is not None and old_plan.fits and old_plan.generation != bm.generation:
                before = _state(bm)
                with pytest.raises(StalePlanError):
                    bm.admit(next_id, old_plan)
                assert _state(bm) == before  # refused before touching anything
            old_plan = plan
            if plan.fits:
                free_before = bm.num_free_blocks
                cached = bm.admit(next_id, plan)
                assert cached == plan.cached_tokens and cached % block_size == 0 and cached < len(prompt)
                assert bm.num_free_blocks == free_before - plan.new_blocks
                # The hits lead the table, each a block holding that stretch of the prompt.
                table = bm.block_table(next_id)
                assert tuple(table[: len(plan.hits)]) == plan.hits
                assert cached == (len(plan.hits) + len(plan.host_hits)) * block_size
                for i, b in enumerate(plan.hits):
                    assert bm.block_tokens[b] == tuple(prompt[i * block_size : (i + 1) * block_size])
                live.append(next_id)
                next_id += 1
        elif op == "append" and live:
            sid = rng.choice(live)
            k = rng.randint(1, block_size + 2)
            if bm.can_append(sid, k):
                before = bm.num_tokens(sid)
                copies = bm.append(sid, [rng.randrange(50) for _ in range(k)])
                # copy-on-write: the rows this sequence writes belong to it alone
                for row in bm.slots(sid, before, before + k):
                    assert bm.ref[row // block_size] == 1
                for c in copies:
                    assert c.dst // block_size in bm.block_table(sid) and 0 < c.num_slots < block_size
        elif op == "fork" and live:
            parent = rng.choice(live)
            bm.fork(parent, next_id)
            assert bm.block_table(next_id) == bm.block_table(parent)
            live.append(next_id)
            next_id += 1
        elif op in ("release", "preempt") and live:
            bm.release(live.pop(rng.randrange(len(live))))
        bm.check_invariants()
        u = bm.usage()
        assert u.reserved_tokens == u.used_tokens + u.fragmentation_tokens
        assert u.reserved_tokens + u.free_tokens == u.pool_tokens
    for sid in live:
        bm.release(sid)
    bm.check_invariants()
    assert not bm.tables
    assert bm.num_free_blocks == num_blocks  # every block free or cached-and-free
    assert bm.usage().used_tokens == 0


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    num_blocks=st.integers(1, 24),
    block_size=st.sampled_from([1, 2, 4, 8, 16]),
    caching=st.booleans(),
    eviction=st.sampled_from(POLICIES),
)
def test_random_operations_keep_invariants(seed, num_blocks, block_size, caching, eviction):
    _run_ops(seed, num_blocks, block_size, caching, steps=120, eviction=eviction)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_blocks=st.integers(1, 12), block_size=st.sampled_from([1, 2, 4, 8]),
       eviction=st.sampled_from(POLICIES), host_blocks=st.integers(1, 20))
def test_random_operations_keep_invariants_with_a_host_tier(seed, num_blocks, block_size, eviction, host_blocks):
    """Small pools, many evictions: every one goes to the tier (impls/host_tier.py)."""
    _run_ops(seed, num_blocks, block_size, True, steps=120, eviction=eviction, host_blocks=host_blocks)


def test_allocates_on_demand():
    bm = BlockManager(10, 4, prefix_caching=False)
    assert bm.admit(0, bm.plan_admit([1, 2, 3, 4, 5])) == 0
    assert bm.num_used_blocks == 2
    bm.append(0, [6, 7, 8])  # fills block 2
    assert bm.num_used_blocks == 2
    bm.append(0, [9])  # a new block only when the last one is full
    assert bm.num_used_blocks == 3
    assert bm.usage().fragmentation_tokens == 3


def test_fork_shares_then_copy_on_write():
    bm = BlockManager(10, 4)
    bm.admit(0, bm.plan_admit([1, 2, 3, 4, 5, 6]))
    bm.fork(0, 1)
    assert bm.num_used_blocks == 2 and bm.usage().logical_tokens == 12 and bm.usage().used_tokens == 6
    copies = bm.append(1, [7])
    assert len(copies) == 1 and copies[0].num_slots == 2
    assert copies[0].src // 4 == bm.block_table(0)[1]
    assert bm.block_table(1)[0] == bm.block_table(0)[0]  # the full block stays shared
    assert bm.block_table(1)[1] != bm.block_table(0)[1]
    assert bm.append(0, [8]) == []  # the parent is now the last holder: no copy
    bm.check_invariants()


def test_prefix_hit_reuses_blocks_and_rechecks_tokens():
    bm = BlockManager(16, 4)
    prompt = list(range(10))
    assert bm.admit(0, bm.plan_admit(prompt)) == 0
    assert bm.admit(1, bm.plan_admit(prompt[:8] + [99, 98])) == 8
    assert bm.block_table(1)[:2] == bm.block_table(0)[:2]
    # A prompt made only of cached full blocks recomputes its last block.
    assert bm.admit(2, bm.plan_admit(prompt[:8])) == 4
    # Freed blocks stay cached: a later request still hits.
    for sid in (0, 1, 2):
        bm.release(sid)
    assert bm.admit(3, bm.plan_admit(prompt)) == 8
    bm.check_invariants()


def test_cached_free_blocks_are_evicted_lru_when_needed():
    bm = BlockManager(4, 2)
    bm.admit(0, bm.plan_admit([1, 2, 3, 4, 5]))  # 3 blocks, two full and hashed
    bm.release(0)
    assert len(bm.evictable) == 2 and bm.num_free_blocks == 4
    bm.admit(1, bm.plan_admit([9, 9, 9, 9, 9, 9, 9]))  # needs all 4 blocks: evicts both cached ones
    assert not bm.evictable and not bm.hash_to_block.get(hash((0, (1, 2))))
    bm.check_invariants()


@pytest.mark.parametrize("eviction, kept", [("lru", False), ("lfu", True), ("2q", True)])
def test_the_eviction_policy_decides_whether_a_reused_prefix_survives_a_scan(eviction, kept):
    """A 4-block system prompt served three times, then one-off prompts that force evictions:
    the frequency-aware and scan-resistant policies keep the prompt cached, lru does not."""
    bm = BlockManager(12, 4, eviction=eviction)
    system = list(range(100, 116))  # 4 full blocks
    sid = 0
    for _ in range(3):
        bm.admit(sid, bm.plan_admit(system + [sid]))
        bm.release(sid)
        sid += 1
    for k in range(4):  # one-off prompts: 8 fresh blocks each; with 12 in the pool, evictions follow
        bm.admit(sid, bm.plan_admit([1000 * (k + 1) + i for i in range(29)]))
        bm.release(sid)
        sid += 1
        bm.check_invariants()
    assert bm.evicted_blocks > 0
    assert (bm.plan_admit(system + [7]).cached_tokens == 16) is kept


def test_watermark_and_rejects():
    bm = BlockManager(4, 4, watermark_blocks=1)
    assert bm.can_admit(list(range(12)))
    assert not bm.can_admit(list(range(13)))  # 4 blocks + watermark 1 > 4


@pytest.mark.parametrize("bad", [0, 3, 12])
def test_bad_block_size(bad):
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, bad)


def _state(bm: BlockManager) -> tuple:
    bm.materialize()  # pending blocks hashed (lazy hashing): the tables as eager hashing has them
    return (bm.tables, bm.tokens, bm.ref, bm.filled, bm.block_hash, bm.block_tokens, bm.hash_to_block,
            list(bm.free), list(bm.evictable), bm._filled_in_use, bm._logical, bm.usage())


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), block_size=st.sampled_from([1, 2, 4, 8]), caching=st.booleans())
def test_appending_many_tokens_at_once_equals_one_at_a_time(seed, block_size, caching):
    """The simulator appends a run of tokens in one call: the same state as a token per call,
    and ``appendable_without_alloc`` tokens never allocate or copy while the next one does."""
    rng = random.Random(seed)
    bulk, single = (BlockManager(64, block_size, prefix_caching=caching) for _ in range(2))
    live: list[int] = []
    for sid in range(40):
        op = rng.choice(["admit", "fork", "append", "append", "append", "release"])
        if op == "admit" or not live:
            prompt = [rng.randrange(4) for _ in range(rng.randint(1, 3 * block_size))]  # repeats make hits
            if bulk.can_admit(prompt):
                assert bulk.admit(sid, bulk.plan_admit(prompt)) == single.admit(sid, single.plan_admit(prompt))
                live.append(sid)
        elif op == "fork":
            parent = rng.choice(live)
            bulk.fork(parent, sid), single.fork(parent, sid)
            live.append(sid)
        elif op == "append":
            seq = rng.choice(live)
            free_run = bulk.appendable_without_alloc(seq)
            # free_run + 1: a silent fill's tokens and the next one, which takes a block (the simulator's)
            k = rng.choice([free_run, free_run + 1, rng.randint(1, 3 * block_size)]) or 1
            if rng.random() < 0.5:  # as the simulator sets it: fills of a pending chain are silent then
                bulk.on_expose = single.on_expose = lambda seq_id: None
            else:
                bulk.on_expose = single.on_expose = None
            generic = (free_run + 1 if free_run and bulk.fill_is_silent(seq) else free_run or 1)
            assert bulk.riding_steps(seq) == generic == FastPath.riding_steps(bulk, seq)
            if not bulk.can_append(seq, k):
                continue
            free_before = bulk.num_free_blocks
            toks = [rng.randrange(4) for _ in range(k)]
            copies = bulk.append(seq, toks)
            assert copies == [c for t in toks for c in single.append(seq, [t])]
            if k <= free_run:  # no block, no copy
                assert not copies and bulk.num_free_blocks == free_before
            if k == free_run:  # and then the next token needs one
                assert bulk.appendable_without_alloc(seq) == 0 and bulk._blocks_to_append(seq, 1) == 1
        else:
            seq = live.pop(rng.randrange(len(live)))
            bulk.release(seq), single.release(seq)
        assert _state(bulk) == _state(single)
        bulk.check_invariants()


@pytest.fixture
def hash_calls(monkeypatch) -> list[int]:
    """Counts the block manager's block hashes (one entry per call)."""
    calls: list[int] = []
    real = kvbench.impls.prefix_chain.chain_hash

    def counting(parent_hash, tokens):
        calls.append(1)
        return real(parent_hash, tokens)

    for module in (kvbench.impls.prefix_chain, kvbench.impls.block_admission):  # the two that hash blocks
        monkeypatch.setattr(module, "chain_hash", counting)
    return calls


@pytest.mark.parametrize("caching", [True, False])
def test_a_block_is_hashed_once_and_only_once_a_lookup_could_reach_it(hash_calls, caching):
    """Planning hashes up to the first block not cached, admitting the rest. A new chain (its first block's
    contents never cached before) hashes only that first block: nothing could look the others up until a
    prompt hits it, and then they are hashed once. Without prefix caching no hash is ever made."""
    bm = BlockManager(64, 4, prefix_caching=caching)
    prompt = list(range(18))  # 4 full blocks and 2 tokens
    # (prompt, hashes): a new chain: its first block only; the same prompt: the walk (4) and, once it hits the
    # first block, the chain's 4 pending blocks (3 of the prompt, 1 filled below), then its own filled block;
    # a partial hit (3 looked up, 1 admitted, 1 filled); an exact prompt (3 looked up, its last block, 1 filled).
    for sid, (toks, hashes) in enumerate([(prompt, 1), (prompt, 9), (prompt[:8] + [99] * 9, 5), (prompt[:16], 5)]):
        hash_calls.clear()
        bm.admit(sid, bm.plan_admit(toks))
        bm.append(sid, [7] * (4 - len(toks) % 4))  # fills a block: it enters the cache
        assert len(hash_calls) == (hashes if caching else 0)
        bm.check_invariants()
    hash_calls.clear()
    bm.materialize()
    assert not hash_calls  # nothing left pending: the first chain was hashed when the second prompt hit it


def test_a_chain_nobody_shares_is_never_hashed(hash_calls):
    """Random prompts in a pool that evicts: each admission hashes its first block (the lookup that misses),
    and nothing else is ever hashed, filled blocks included, while the answers are eager hashing's."""
    rng = random.Random(7)
    lazy, eager = BlockManager(40, 4), BlockManager(40, 4)
    eager._lazy = False
    for sid in range(60):
        prompt = [rng.randrange(10**6) for _ in range(rng.randint(4, 30))]
        calls = len(hash_calls)
        for bm in (lazy, eager):
            while bm.num_free_blocks < (len(prompt) + 9 + 3) // 4:  # room for the prompt and the appends
                bm.release(min(bm.tables))
            plan = bm.plan_admit(prompt)
            bm.admit(sid, plan)
            bm.append(sid, [5] * 9)
            bm.check_invariants()
        if sid == 0:
            lazy_calls = len(hash_calls) - calls - 1 - (len(prompt) + 9) // 4  # eager hashed every full block
            assert lazy_calls == 0
        assert lazy.evicted_blocks == eager.evicted_blocks and lazy.num_free_blocks == eager.num_free_blocks
    assert lazy.evicted_blocks > 0
    hashed_by_lazy = len(hash_calls)
    assert _state(lazy) == _state(eager) and len(hash_calls) > hashed_by_lazy  # materialize hashed the rest


def test_a_scheduler_step_hashes_each_admitted_prompt_once(hash_calls):
    """The scheduler plans an admission once: the prompt is not hashed again by admit or a budget check."""
    from kvbench.harness.serving.scheduler import Scheduler
    from kvbench.harness.serving.workload import Request

    bm = BlockManager(256, 4)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=1000)
    prompts = [tuple(range(17)), tuple(range(17)), tuple(range(8)) + (7,) * 9]  # a miss, a hit, a partial hit
    for i, p in enumerate(prompts):
        sched.add_request(Request(i, p, 4))
    plan = sched.schedule()
    assert len(plan.admitted) == 3
    assert len(hash_calls) == sum(len(p) // 4 for p in prompts)
    assert [a.seq.num_cached for a in plan.admitted] == [0, 16, 8]


def test_a_plan_is_stale_once_the_pool_changes():
    bm = BlockManager(16, 4)
    bm.admit(0, bm.plan_admit([1, 2, 3, 4, 5]))
    for change in (lambda: bm.append(0, [6]), lambda: bm.fork(0, 1), lambda: bm.release(1),
                   lambda: bm.admit(2, bm.plan_admit([7]))):
        plan = bm.plan_admit([1, 2, 3, 4, 9])
        change()
        before = _state(bm)
        with pytest.raises(StalePlanError):
            bm.admit(3, plan)
        assert _state(bm) == before
    assert bm.admit(3, bm.plan_admit([1, 2, 3, 4, 9])) == 4  # planned afresh: the cached first block


def test_a_plan_that_does_not_fit_is_refused():
    bm = BlockManager(2, 4)
    plan = bm.plan_admit(list(range(9)))  # 3 blocks
    assert not plan.fits and plan.new_blocks == 3
    with pytest.raises(ValueError, match="does not fit"):
        bm.admit(0, plan)
    assert not bm.tables and bm.num_free_blocks == 2


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), block_size=st.sampled_from([1, 2, 4, 16]), caching=st.booleans(),
       num_blocks=st.sampled_from([6, 24]))
def test_try_append_equals_can_append_then_append(seed, block_size, caching, num_blocks):
    """The scheduler's one-call ``try_append`` on a small pool (copy-on-write, evictions, refusals):
    the same answers, block tables, hits and free lists as ``can_append`` followed by ``append``."""
    rng = random.Random(seed)
    fused, stepwise = (BlockManager(num_blocks, block_size, prefix_caching=caching) for _ in range(2))
    prefix = [rng.randrange(3) for _ in range(3 * block_size)]
    live: list[int] = []
    for sid in range(80):
        op = rng.choice(["admit", "fork", "append", "append", "append", "append", "release"])
        if op == "admit" or not live:
            prompt = _prompt(rng, prefix)[: 4 * block_size]
            plan = fused.plan_admit(prompt)
            assert plan == stepwise.plan_admit(prompt)
            if plan.fits:
                assert fused.admit(sid, plan) == stepwise.admit(sid, stepwise.plan_admit(prompt))
                live.append(sid)
        elif op == "fork":
            parent = rng.choice(live)
            fused.fork(parent, sid), stepwise.fork(parent, sid)
            live.append(sid)
        elif op == "append":
            seq = rng.choice(live)
            toks = [rng.randrange(3)] * rng.choice([1, 1, block_size - 1 or 1, rng.randint(1, 3 * block_size)])
            got = fused.try_append(seq, toks)
            assert got == (stepwise.append(seq, toks) if stepwise.can_append(seq, len(toks)) else None)
        else:
            seq = live.pop(rng.randrange(len(live)))
            fused.release(seq), stepwise.release(seq)
        assert _state(fused) == _state(stepwise) and fused.cache_hit_tokens == stepwise.cache_hit_tokens
        fused.check_invariants()


def _lazy_and_eager(num_blocks: int, block_size: int, eviction: str) -> tuple[BlockManager, BlockManager]:
    lazy = BlockManager(num_blocks, block_size, eviction=eviction)
    eager = BlockManager(num_blocks, block_size, eviction=eviction)
    eager._lazy = False  # every full block hashed as it is registered
    return lazy, eager


def _answers(bm: BlockManager) -> tuple:
    """What the pool tells its users, without hashing anything pending."""
    return (bm.tables, bm.tokens, bm.ref, bm.filled, list(bm.free), list(bm.evictable), bm.num_free_blocks,
            bm.evicted_blocks, bm.cache_hit_tokens, bm.usage())


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_blocks=st.sampled_from([4, 9, 24]), block_size=st.sampled_from([1, 2, 4]),
       eviction=st.sampled_from(POLICIES))
def test_lazy_hashing_answers_as_eager_hashing(seed, num_blocks, block_size, eviction):
    """Random admissions (shared prefixes, prompts of exactly one block, recomputed preempted sequences),
    appends that fill blocks, forks and releases in a pool that evicts: lazy hashing gives the plans, hits,
    free lists, evictions and usage of eager hashing after every operation, and the same tables once its
    pending blocks are hashed (``materialize``, at random moments too: hashing early changes nothing)."""
    rng = random.Random(seed)
    lazy, eager = _lazy_and_eager(num_blocks, block_size, eviction)
    prefixes = [[rng.randrange(3) for _ in range(4 * block_size)] for _ in range(2)]
    live: list[int] = []
    next_id = 0
    for _ in range(150):
        op = rng.choice(["admit", "admit", "readmit", "copy", "append", "append", "append", "fill", "mimic", "fork",
                         "release", "drop"])
        if op in ("admit", "readmit", "copy"):
            if op == "readmit" and live:  # preempted: released, then its prompt and outputs admitted again
                sid = live.pop(rng.randrange(len(live)))
                prompt = list(lazy.tokens[sid])
                lazy.release(sid), eager.release(sid)
            elif op == "copy" and live:  # the first block (or more) of a running sequence: a chain of the same contents
                prompt = lazy.tokens[rng.choice(live)][: block_size * rng.choice([1, 1, 2])]
            else:
                shape = rng.random()
                if shape < 0.2:
                    prompt = rng.choice(prefixes)[:block_size]  # exactly one block: never looked up
                else:
                    prompt = rng.choice(prefixes)[: rng.randint(0, 4 * block_size)]
                    prompt = prompt + [rng.randrange(3) for _ in range(rng.randint(0 if prompt else 1, 2 * block_size))]
            plans = lazy.plan_admit(prompt), eager.plan_admit(prompt)
            assert plans[0] == plans[1]
            if plans[0].fits:
                assert lazy.admit(next_id, plans[0]) == eager.admit(next_id, plans[1])
                live.append(next_id)
                next_id += 1
        elif op in ("append", "fill", "mimic") and live:
            sid = rng.choice(live)
            k = (lazy.appendable_without_alloc(sid) or 1) if op == "fill" else rng.randint(1, 2 * block_size)
            toks = [rng.randrange(3)] * k
            if op == "mimic":  # go on as another sequence went on: the same contents in two chains
                have, other = lazy.tokens[sid], lazy.tokens[rng.choice(live)]
                toks = other[len(have) : len(have) + k] or toks
            assert lazy.try_append(sid, toks) == eager.try_append(sid, toks)
        elif op == "fork" and live:
            parent = rng.choice(live)
            lazy.fork(parent, next_id), eager.fork(parent, next_id)
            live.append(next_id)
            next_id += 1
        elif op == "release" and live:
            sid = live.pop(rng.randrange(len(live)))
            lazy.release(sid), eager.release(sid)
        elif op == "drop" and live:  # chunked prefill's preemption: the blocks past what was written leave the cache
            sid = live.pop(rng.randrange(len(live)))
            written = rng.randint(0, lazy.num_tokens(sid))
            for bm in (lazy, eager):
                bm.drop_unwritten(sid, written)
                bm.release(sid)
        assert _answers(lazy) == _answers(eager)
        lazy.check_invariants()
        if rng.random() < 0.05:
            lazy.materialize()
    assert _state(lazy) == _state(eager)


def test_plans_and_usage_made_without_init_are_the_frozen_dataclasses():
    """The hot paths build ``PagedAdmitPlan`` and ``CacheUsage`` without their ``__init__``
    (impls/allocator.py frozen_instance): equal to, hashing as and as frozen as ones built the usual way."""
    import dataclasses

    from kvbench.impls.allocator import CacheUsage
    from kvbench.impls.block_admission import PagedAdmitPlan

    bm = BlockManager(8, 4)
    prompt = (1, 2, 3, 4, 5)
    plan = bm.plan_admit(prompt, 2, 9)
    usual = PagedAdmitPlan(prompt, 2, 9, cached_tokens=0, fits=True, generation=0, hits=(), next_hash=plan.next_hash,
                           new_blocks=2, host_hits=())
    assert plan == usual and hash(plan) == hash(usual) and repr(plan) == repr(usual)
    bm.admit(0, plan)
    u = bm.usage()
    assert u == CacheUsage(32, 8, 5, 5, 3, 0, 1, 24, 0) and hash(u) == hash(dataclasses.replace(u))
    for obj, field in ((plan, "fits"), (u, "used_tokens")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, 0)
