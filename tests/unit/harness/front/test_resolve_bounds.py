"""Every size a user or a file sets is checked against what the machine or the model allows before anything
is allocated, in one line naming the key and its allowed range (issue 41, "Resources")."""

from __future__ import annotations

import json
import os
import re
import tracemalloc
from types import SimpleNamespace

import numpy as np
import psutil
import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.resolve import resolve
from kvbench.harness.kv.factory import block_bytes, build_cache, check_host_memory, host_tier_blocks, host_tier_note
from kvbench.harness.serving.hash_blocks import HashBlockTokens
from kvbench.impls.host_tier import HostTier

GB = 10**9
CAPACITY = ["+impl=paged_torch", "scenario=capacity", "model=tiny-llama"]
DECODE = ["+impl=paged_torch", "model=tiny-llama", "device=cpu", "max_seq_len=64", "workload.prompt_len=12",
          "workload.output_len=5", "scenario.warmup=0"]


@pytest.fixture
def ram(monkeypatch):
    """Pretend the machine has ``available`` bytes of RAM available, as psutil reports it."""

    def set_available(available: int) -> None:
        monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=available, total=available))

    return set_available


def refusal(compose, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        resolve(compose(overrides))
    message = str(err.value)
    assert "\n" not in message
    return message


# ---- device.host_kv_gb ------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra", [[], ["kv_dtype=fp8_e4m3"], ["block_size=128"]])
def test_a_host_tier_smaller_than_one_block_names_the_block_and_the_smallest_useful_value(compose, extra):
    """It was refused with advice to raise device.memory_gb or lower max_seq_len, which do not help."""
    message = refusal(compose, [*CAPACITY, *extra, "device.host_kv_gb=0.000001"])
    assert message.startswith("device.host_kv_gb=1e-06 holds less than one block (") and "memory_gb" not in message
    one = block_bytes(resolve(compose([*CAPACITY, *extra])))
    assert f"({one} bytes a block" in message
    smallest = re.search(r"the smallest useful value is (\S+) ", message).group(1)
    cfg = resolve(compose([*CAPACITY, *extra, f"device.host_kv_gb={smallest}"]))  # it is: one block
    assert host_tier_blocks(cfg) == 1


def test_a_wall_clock_host_tier_is_bounded_by_the_ram_available(compose, ram):
    """device.host_kv_gb=100 on the wall clock became an oom row with torch's allocator text."""
    ram(10 * GB)
    message = refusal(compose, [*DECODE, "device.host_kv_gb=100"])
    assert message.startswith("device.host_kv_gb=100 is allocated in host RAM and may take at most 80% of the "
                              "10.00 GB available; allowed: device.host_kv_gb in [")
    assert message.endswith(", 8] (or 0: no host tier)")
    assert "device.host_kv_gb=8.5" in refusal(compose, [*DECODE, "device.host_kv_gb=8.5"])  # just above
    cfg = resolve(compose([*DECODE, "device.host_kv_gb=7.9"]))
    assert host_tier_note(cfg, 10 * GB) == ("the host tier (device.host_kv_gb=7.9) takes 79% of the 10.00 GB of RAM "
                                            "available at its start")
    assert host_tier_note(resolve(compose([*DECODE, "device.host_kv_gb=4"])), 10 * GB) is None


def test_a_wall_clock_host_tier_is_checked_again_beside_the_pool_when_built(compose, ram):
    """On CPU the pool is in RAM too: a tier that fitted alone at resolve is refused beside it, before either exists."""
    ram(10 * GB)
    cfg = resolve(compose([*DECODE, "device.host_kv_gb=6"]))
    with pytest.raises(ConfigError, match=r"beside a KV pool of 3.00 GB in RAM; allowed: device.host_kv_gb in \[.*, 5\]"):
        build_cache(cfg.impl, cfg, 3 * GB, "cpu")


def test_a_simulated_host_tier_of_terabytes_costs_only_the_blocks_it_stores(compose, ram):
    """A slot list of every slot took 40 bytes a slot (12 GB for 20 TB of tiny-llama); slots are handed out lazily."""
    ram(2 * GB)
    cfg = resolve(compose([*CAPACITY, "device.host_kv_gb=20000"]))
    assert host_tier_blocks(cfg) == 20000 * GB // block_bytes(cfg) > 300_000_000
    tracemalloc.start()
    tier = HostTier(host_tier_blocks(cfg))
    tier.store(7, hash("block"), (1, 2, 3))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100_000 and tier.take_copies().stores == ((7, 0),) and tier.num_free_slots == tier.capacity - 1


def test_a_simulated_host_tier_is_bounded_by_its_bookkeeping_not_by_the_ram_size(compose, ram):
    """The same tier passes with a small workload and is refused when the workload could fill it past the RAM."""
    ram(2 * GB)
    big = ["workload.num_requests=100000", "block_size=1"]
    resolve(compose([*CAPACITY, *big]))  # the workload alone fits
    message = refusal(compose, [*CAPACITY, *big, "device.host_kv_gb=20000"])
    assert message.startswith("device.host_kv_gb=20000 makes a host tier of ") and "whose bookkeeping takes about" in message
    allowed = float(re.search(r"allowed: device.host_kv_gb in \[\S+, (\S+)\]$", message).group(1))
    resolve(compose([*CAPACITY, *big, f"device.host_kv_gb={allowed}"]))


@pytest.mark.parametrize("overrides, key", [
    (["device.kv_cache_gb=2000"], "device.kv_cache_gb"),
    ([], "device.memory_gb"),  # the simulated box's memory sizes the pool
])
def test_a_simulated_pool_of_tiny_blocks_is_bounded_by_its_bookkeeping(compose, ram, overrides, key):
    """8 x H200 of tiny-llama at block_size=1: half a billion blocks, 72 bytes each, before the run starts."""
    ram(24 * GB)
    box = [*CAPACITY, "gpu=h200", "gpu.count=8", *overrides]
    message = refusal(compose, [*box, "block_size=1"])
    assert message.startswith(f"{key}=") and "blocks of 2048 bytes (block_size=1), whose bookkeeping" in message
    top = float(re.search(rf"allowed: {key} up to (\S+), or a larger block_size$", message).group(1))
    resolve(compose([*box, "block_size=1", f"{key}={top}"]))  # the top of the range is allowed
    assert refusal(compose, [*box, "block_size=1", f"{key}={top * 1.01}"]).startswith(f"{key}=")
    resolve(compose(box))  # block_size=16: 16 times fewer blocks


def test_system_prompts_and_a_long_shared_prefix_are_bounded_before_they_are_drawn(compose, ram):
    """workload.system_prompts=1e9 grew the process without end; a shared prefix of 1e11 tokens was an oom row."""
    ram(24 * GB)
    message = refusal(compose, [*CAPACITY, "workload=system_prompt", "workload.system_prompts=1000000000"])
    assert message.startswith("workload.system_prompts=1000000000 of workload.system_prompt_len=256 tokens takes about")
    assert re.search(r"allowed: workload.system_prompts in \[1, \d+\]$", message)
    resolve(compose([*CAPACITY, "workload=system_prompt", "workload.system_prompts=100000"]))
    message = refusal(compose, [*CAPACITY, "max_seq_len=1000000000000", "workload.shared_prefix_len=100000000000",
                                "workload.num_requests=1"])
    assert message.startswith("workload.shared_prefix_len=100000000000, in each of 1 prompts,")
    assert re.search(r"allowed: workload.shared_prefix_len in \[0, \d+\]$", message)


def test_the_bounds_take_the_ram_reading_given(compose):
    """check_host_memory reads no RAM itself: the caller's reading, as resolve passes it."""
    cfg = resolve(compose([*CAPACITY, "gpu=h200", "gpu.count=8"]))
    check_host_memory(cfg, 24 * GB)
    with pytest.raises(ConfigError, match="device.memory_gb=1206.04 makes a KV pool"):
        check_host_memory(cfg, GB)


# ---- workload.hash_block_size -----------------------------------------------------------------------------

def mooncake(tmp_path, *lengths: int) -> str:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": n, "output_length": 4, "hash_ids": [i]}) + "\n"
                            for i, n in enumerate(lengths)))
    return str(path)


def test_a_hash_block_is_at_most_the_longest_prompt_or_max_seq_len(compose, tmp_path):
    """A 40-token prompt with workload.hash_block_size=1e9 drew a billion tokens (7.45 GiB) for its one block."""
    trace = ["workload=mooncake", f"workload.path={mooncake(tmp_path, 40)}"]
    message = refusal(compose, [*CAPACITY, *trace, "workload.hash_block_size=1000000000"])
    assert message == ("workload.hash_block_size=1000000000 must be in [1, 1024] tokens: no prompt reads a block past "
                       "the trace's longest prompt (40 tokens) or max_seq_len=1024, whichever is larger "
                       "(1024 gives the same tokens)")
    resolve(compose([*CAPACITY, *trace, "workload.hash_block_size=1024"]))
    long = ["workload=mooncake", f"workload.path={mooncake(tmp_path, 40, 3000)}"]  # a prompt past max_seq_len
    resolve(compose([*CAPACITY, *long, "workload.hash_block_size=3000"]))
    assert "must be in [1, 3000]" in refusal(compose, [*CAPACITY, *long, "workload.hash_block_size=3001"])


def test_a_hash_block_is_drawn_only_as_far_as_a_prompt_reads_it():
    """Whatever the block size, a prompt draws its own tokens: the same as a block of just that length draws."""
    rng = np.random.default_rng(0)
    tracemalloc.start()
    huge = HashBlockTokens(10**9, 32000, 3, lambda ids: ids.tolist())
    prompt = huge.prompt([5, 6], 40, rng)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000 and prompt == HashBlockTokens(40, 32000, 3, lambda ids: ids.tolist()).block(5)
    assert huge.prompt([5], 300, rng)[:40] == prompt  # read further later: the same tokens first
    assert HashBlockTokens(16, 32000, 3, lambda ids: ids.tolist()).prompt([5], 10, rng) == prompt[:10]


# ---- scenario.context_len, cpu_threads, float keys, interpolations ----------------------------------------

def test_the_kernel_pool_is_bounded_by_the_ram(compose, ram):
    """scenario.context_len=1e12 was an oom row with the CPU allocator's text."""
    ram(10 * GB)
    kernel = ["+impl=paged_torch", "scenario=kernel", "model=tiny-llama", "device=cpu"]
    message = refusal(compose, [*kernel, "scenario.context_len=1000000000000"])
    assert message.startswith("scenario.context_len=1000000000000 x batch=8 makes a kernel pool of ")
    top = int(re.search(r"allowed: scenario.context_len in \[1, (\d+)\] at batch=8$", message).group(1))
    resolve(compose([*kernel, f"scenario.context_len={top}"]))
    assert "makes a kernel pool" in refusal(compose, [*kernel, f"scenario.context_len={top + 1024}"])
    too_wide = refusal(compose, [*kernel, "batch=100000000", "workload.num_requests=1"])
    assert too_wide.endswith("allowed: scenario.context_len in [1, 0] at batch=100000000, or a smaller batch")


def test_cpu_threads_are_at_most_the_machines_cpus_where_they_run(compose):
    """cpu_threads=100000 ended a decode run in an allocator failure and Hydra's traceback."""
    cpus = os.cpu_count()
    assert refusal(compose, [*DECODE, "cpu_threads=100000"]).startswith(f"cpu_threads=100000 must be in [1, {cpus}]")
    resolve(compose([*DECODE, f"cpu_threads={cpus}"]))
    assert resolve(compose([*CAPACITY, "cpu_threads=100000"])).cpu_threads == 100000  # recorded, never used


@pytest.mark.parametrize("override, expected", [
    ("workload.prompt_len=1e999", "workload.prompt_len=inf must be a finite number"),  # was an OverflowError
    ("workload.sigma=inf", "workload.sigma=inf must be a finite number"),
    ("scenario.concurrency_points=[1,2]", None),
])
def test_float_keys_are_finite(compose, override, expected):
    if expected is None:
        resolve(compose([*CAPACITY, override]))
    else:
        assert refusal(compose, [*CAPACITY, override]) == expected


@pytest.mark.parametrize("override, expected", [
    ("batch=${oc.env:KVBENCH_SURELY_UNSET}", "Environment variable 'KVBENCH_SURELY_UNSET' not found"),
    ("batch=${nope}", "Interpolation key 'nope' not found"),
])
def test_an_interpolation_that_does_not_resolve_is_a_config_error(compose, override, expected):
    message = refusal(compose, [*CAPACITY, override])
    assert message.startswith("batch: its interpolation cannot be resolved: ") and expected in message
