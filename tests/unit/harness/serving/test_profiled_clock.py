"""The profiled clock: piecewise-linear prices through measured points, sums over steps in closed form."""

import random

import pytest

from kvbench.harness.serving.profiled_clock import Line, ProfiledClock, ProfilePoints, clock_from_rows, profile_id


def test_a_line_passes_through_its_points_and_extends_its_end_segments():
    line = Line((1.0, 3.0, 7.0), (2.0, 6.0, 8.0))
    assert [line(x) for x in (1.0, 2.0, 3.0, 5.0, 7.0)] == [2.0, 4.0, 6.0, 7.0, 8.0]
    assert line(9.0) == 9.0 and line(0.0) == 0.0  # slopes 0.5 to the right, 2 to the left
    assert Line((4.0,), (3.0,))(100.0) == 3.0


@pytest.mark.parametrize("seed", range(20))
def test_sum_steps_equals_the_sum_of_each_step_on_awkward_grids(seed):
    rng = random.Random(seed)
    xs = sorted(rng.sample(range(1, 600), rng.randint(1, 7)))
    line = Line(tuple(float(x) for x in xs), tuple(rng.uniform(0, 5) for _ in xs))
    x0, k = rng.uniform(-50, 700), rng.randint(1, 400)
    brute = sum(line(x0 + j) for j in range(k))
    assert line.sum_steps(x0, k) == pytest.approx(brute, rel=1e-9, abs=1e-9)


def _clock() -> ProfiledClock:
    decode = [(b, c, 0.001 * b + 0.00001 * b * c) for b in (1, 4, 16) for c in (16.0, 128.0, 512.0)]
    return ProfiledClock(ProfilePoints(tuple(decode), ((16, 0.002), (256, 0.01), (1024, 0.04))))


def test_decode_is_exact_on_the_grid_and_linear_between_batches_and_contexts():
    clock = _clock()
    assert clock.decode_s(4, 4 * 128) == pytest.approx(0.004 + 0.00001 * 4 * 128)
    # batch 10 lies 6/12 of the way from 4 to 16; at context 128 each line is exact
    at4, at16 = 0.004 + 0.00001 * 4 * 128, 0.016 + 0.00001 * 16 * 128
    assert clock.decode_s(10, 10 * 128) == pytest.approx(at4 + 0.5 * (at16 - at4))
    assert clock.outside == 0
    # k steps of a batch: each reads one token more per sequence
    assert clock.decode_s(4, 4 * 100, 30) == pytest.approx(sum(clock.decode_s(4, 4 * (100 + j)) for j in range(30)))


def test_prices_outside_the_profile_are_counted_and_never_negative():
    clock = _clock()
    clock.decode_s(64, 64 * 100)  # a batch beyond the profile
    clock.decode_s(4, 4 * 1000, 5)  # contexts beyond it, 5 steps
    assert clock.outside == 6
    assert clock.prefill_s(4) == clock.prefill_s(16) == 0.002  # never cheaper than the smallest measured
    assert clock.prefill_s(2048) == pytest.approx(0.04 + (0.04 - 0.01) / 768 * 1024)
    assert clock.outside == 7
    steep = ProfiledClock(ProfilePoints(((1, 10.0, 0.0), (1, 20.0, 0.001)), ((16, 0.001),)))
    assert steep.decode_s(1, 1) == 0.0  # the left extension would go below zero


def test_the_same_points_give_the_same_id():
    a, b = _clock(), _clock()
    assert a.id == b.id == profile_id(a.points) and a.id.startswith("profile-")
    assert profile_id(ProfilePoints(a.points.decode[:-1], a.points.prefill)) != a.id


def test_a_fallback_prices_the_shapes_outside_the_profile():
    class Roofline:
        def prefill_s(self, tokens, prompts=1, spans=()):
            return 1.0

        def decode_s(self, batch, kv, steps=1):
            return 2.0 * steps

    clock = _clock()
    clock.fallback = Roofline()
    inside = clock.decode_s(4, 4 * 128, 3)
    assert inside < 1 and clock.outside == 0  # inside: the profile's own price
    assert clock.decode_s(64, 64 * 100, 3) == 6.0 and clock.prefill_s(4096) == 1.0 and clock.outside == 4


def test_a_mixed_step_is_the_decode_plus_what_the_chunk_adds_along_the_prefill_line():
    clock = _clock()
    assert clock.mixed_s(256, 0, 0) == pytest.approx(clock.prefill_s(256))
    assert clock.mixed_s(0, 4, 4 * 128) == pytest.approx(clock.decode_s(4, 4 * 128))
    # 240 chunk tokens + 4 decodes: the first segment's slope (0.008 / 240 per token) times 240 more rows,
    # its line extended below 16 tokens for the decodes' 4 rows
    slope = (0.01 - 0.002) / 240
    assert clock.mixed_s(240, 4, 4 * 128) == pytest.approx(clock.decode_s(4, 4 * 128) + slope * 240)
    assert clock.outside == 0
    clock.mixed_s(1100, 4, 4 * 128)  # beyond the largest prefill measured
    assert clock.outside == 1


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
def test_a_simulation_counts_each_step_outside_the_profile_once(chunked):
    """Every decode context here lies below the profiled ones, so every decode step (mixed ones too) is
    outside and the count is the run's decode steps: the simulator's search for a jump's end and its
    per-step gaps price without counting (they counted each step two to three times before)."""
    from kvbench.harness.serving.simulator import simulate
    from kvbench.harness.serving.workload import Request
    from kvbench.impls.block_manager import BlockManager

    decode = tuple((b, c, 0.01 * b + 1e-6 * c) for b in (1, 8) for c in (5000.0, 6000.0))
    clock = ProfiledClock(ProfilePoints(decode, ((1, 0.001), (4096, 0.05))))
    requests = [Request(i, tuple(range(i, i + 20 + 7 * i)), 30 + 11 * i) for i in range(8)]
    sim = simulate(BlockManager(200, 16), requests, 4, 64, 32000, 1, clock=clock,
                   arrival_s=[0.05 * i for i in range(8)], chunked_prefill=chunked)
    assert sim.finished == 8 and sim.decode_steps > len(sim.records) / 2  # jumps of many steps
    assert clock.outside == sim.decode_steps


def test_a_batch_line_measured_at_short_contexts_only_counts_a_longer_step_outside():
    # scenario=profile's reach: a small KV budget measures batch 32 up to context 212 only
    rows = [(b, c, 1e-3 * b + 1e-5 * c) for b in (16, 32) for c in (16, 90, 212, 503) if (b, c) != (32, 503)]
    clock = clock_from_rows(rows, [(16, 1e-3)])
    clock.decode_s(24, 24 * 200)  # between the lines, within both
    clock.decode_s(16, 16 * 400)  # on the long line alone
    assert clock.outside == 0
    clock.decode_s(24, 24 * 300)  # past batch 32's contexts
    clock.decode_s(32, 32 * 300)
    assert clock.outside == 2


def test_a_mixed_step_also_pays_the_prefill_attention_path_beside_the_decode_one():
    # each layer of a mixed step attends its decode rows through forward_decode and the chunk's through
    # forward_prefill: the prefill path's fixed part (the smallest prefill point's attention time) is not in the
    # decode step, and the difference along the prefill line cancels it
    from dataclasses import replace

    from kvbench.harness.serving.profiled_clock import prefill_path_s

    base = _clock()
    paid = ProfiledClock(replace(base.points, prefill_path_s=0.0007))
    for tokens, batch, read in ((240, 4, 4 * 128), (17, 1, 20), (900, 16, 16 * 300)):
        assert paid.mixed_s(tokens, batch, read) == pytest.approx(base.mixed_s(tokens, batch, read) + 0.0007)
    # a prefill alone or a decode alone runs one path: priced as before
    assert paid.mixed_s(256, 0, 0) == base.mixed_s(256, 0, 0) and paid.mixed_s(0, 4, 512) == base.mixed_s(0, 4, 512)
    # the smallest point's attention, whatever the order; none timed (a table made before it): nothing added,
    # and such a table keeps its id
    assert prefill_path_s([(256, 0.002), (16, 0.0007), (64, 0.001)]) == 0.0007
    assert prefill_path_s([(16, None), (64, 0.001)]) == 0.0 and prefill_path_s([]) == 0.0
    assert base.id == profile_id(ProfilePoints(base.points.decode, base.points.prefill)) != paid.id
