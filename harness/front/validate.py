"""The checks of the keys that do not depend on the device, run before the device is looked for
(harness/front/resolve.py): the run's own keys (batch, seed, sizes, the device's fractions, preemption), the
scenario's, the clock profile's and the impl's; the workload's, arrival's and SLO's are in
harness/front/validate_workload.py.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from kvbench.harness.config import MAX_BLOCK_SIZE, PROBES, Config, ImplConfig, SearchScenario
from kvbench.harness.errors import ConfigError
from kvbench.harness.front.checks import check, check_finite_floats, one_of
from kvbench.harness.front.validate_workload import validate_arrival, validate_slo, validate_workload
from kvbench.harness.kv.budget import check_memory_values
from kvbench.harness.scenarios import schemas
from kvbench.harness.scenarios.decode import DecodeScenario
from kvbench.harness.scenarios.kernel import KernelScenario


def validate(cfg: Config) -> None:
    validate_scenario(cfg)
    check(cfg.batch >= 1, f"batch={cfg.batch} must be >= 1")
    check(cfg.max_num_batched_tokens >= 1, f"max_num_batched_tokens={cfg.max_num_batched_tokens} must be >= 1")
    check(not cfg.chunked_prefill or cfg.max_num_batched_tokens >= cfg.batch,
         f"chunked_prefill=true: max_num_batched_tokens={cfg.max_num_batched_tokens} must be >= batch={cfg.batch} "
         f"(every step's token budget holds one decode token per running sequence)")
    check(cfg.repeat >= 1, f"repeat={cfg.repeat} must be >= 1")
    check(cfg.seed >= 0, f"seed={cfg.seed} must be >= 0")  # numpy's generators take no negative seed
    check(cfg.cpu_threads is None or cfg.cpu_threads >= 1, f"cpu_threads={cfg.cpu_threads} must be >= 1 (or null: the cores free at the job's start)")
    cpus = os.cpu_count() or 1  # a bookkeeping run computes on no thread: it only records the number
    check(cfg.cpu_threads is None or cfg.scenario.bookkeeping or cfg.cpu_threads <= cpus,
         f"cpu_threads={cfg.cpu_threads} must be in [1, {cpus}] (this machine's logical CPUs; more only wait on "
         "each other), or null: the cores free at the job's start")
    check(cfg.max_seq_len >= 2, f"max_seq_len={cfg.max_seq_len} must be >= 2")
    bs = cfg.block_size
    check(_power_of_two_block(bs),
         f"block_size={bs} must be a power of two in [1, {MAX_BLOCK_SIZE}] (1, 2, 4, ..., {MAX_BLOCK_SIZE})")
    d = cfg.device
    check(0 < d.utilization <= 1, f"device.utilization={d.utilization} must be in (0, 1]")
    check_memory_values(cfg)  # their bounds need the device (check_memory_bounds, in resolve)
    check(0 <= d.watermark < 1, f"device.watermark={d.watermark} must be in [0, 1)")
    check(d.host_kv_gb is None or 0 <= d.host_kv_gb < float("inf"),
         f"device.host_kv_gb={d.host_kv_gb} must be >= 0 and finite (null or 0: no host tier)")
    one_of("preemption", cfg.preemption, ("recompute", "swap"))
    one_of("host_copy", cfg.host_copy, ("batched", "per_block"))
    validate_kv_manager(cfg)
    check(cfg.preemption != "swap" or bool(d.host_kv_gb),
         f"preemption=swap copies a victim's blocks to the host tier: set device.host_kv_gb > 0 "
         f"(device.host_kv_gb={d.host_kv_gb})")
    validate_workload(cfg)
    validate_arrival(cfg)
    validate_slo(cfg)
    validate_clock_profile(cfg)
    validate_weight_dtype(cfg)
    if cfg.impl is not None:
        validate_impl(cfg.impl)
    check_finite_floats(cfg)  # last: the keys' own checks above say more


def validate_kv_manager(cfg: Config) -> None:
    """``kv_manager``, ``swa_full_tokens_ratio`` and the model's layer kinds they group (harness/kv/groups.py)."""
    from kvbench.harness.kv.groups import (
        KV_MANAGERS, PREFIX_CACHING_MANAGERS, has_one_kind, prefix_caching_refusal, state_refusal,
    )

    one_of("kv_manager", cfg.kv_manager, KV_MANAGERS)
    r = cfg.swa_full_tokens_ratio
    check(isinstance(r, (int, float)) and r > 0 and r == r and r != float("inf"),
         f"swa_full_tokens_ratio={r} must be a finite number > 0 (sliding-window pool tokens per full-attention "
         "pool token, kv_manager=split_pools)")
    try:
        one = has_one_kind(cfg.model)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if cfg.impl is not None:  # a linear-attention layer's state needs hybrid's grouped pool (harness/kv/groups.py)
        refusal = state_refusal(cfg.model, cfg.kv_manager, cfg.impl.cache)
        check(refusal is None, str(refusal))
    if cfg.cuda_graph or cfg.cpu_compile:  # a linear layer's state is the eager forward's (harness/model/support.py)
        from kvbench.harness.model.support import traced_decode_refusal

        traced = traced_decode_refusal(cfg.model)
        check(traced is None, str(traced))
    prefix = cfg.impl is not None and cfg.impl.cache == "paged" and cfg.impl.prefix_caching
    check(one or cfg.kv_manager in PREFIX_CACHING_MANAGERS or not prefix,
         prefix_caching_refusal(cfg.kv_manager, cfg.model.name))
    if prefix and not one and cfg.kv_manager != "uniform":
        check(cfg.impl.eviction == "lru",
             f"impl.eviction={cfg.impl.eviction} with kv_manager={cfg.kv_manager} on model={cfg.model.name}: the "
             "grouped pool's prefix cache gives up its least recently freed block first (impls/group_prefix.py); "
             "allowed: impl.eviction=lru (or kv_manager=uniform)")
    # Every scenario reads a grouped pool's usage in its own unit (harness/kv/factory.py usage_unit_bytes; decode's
    # grouped cache, impls/grouped_paged.py, says it in its bytes_per_token), the searches' probes too. A contiguous
    # (or Orca) cache has no groups: it caches every layer as full attention (its rows say uniform).


def validate_clock_profile(cfg: Config) -> None:
    """clock_profile=PATH: a readable profile table (its impl is checked when the impl runs)."""
    if cfg.clock_profile is None:
        check(cfg.clock_profile_impl is None, "clock_profile_impl needs clock_profile=RUN_DIR (a scenario=profile run)")
        check(not cfg.clock_profile_allow_mismatch,
             "clock_profile_allow_mismatch needs clock_profile=RUN_DIR (a scenario=profile run)")
        return
    check(cfg.scenario.bookkeeping,
         f"clock_profile prices simulated steps; scenario={cfg.scenario.name} runs on the wall clock "
         "(use it with scenario=capacity, or scenario=max_rate / max_concurrency with scenario.probe=capacity)")
    from kvbench.harness.serving.profile_table import read_profile_table

    read_profile_table(Path(cfg.clock_profile))  # one line naming the problem, before any job starts


def validate_weight_dtype(cfg: Config) -> None:
    """``weight_dtype``: a stored dtype the roofline prices (harness/kv/sizes.py WEIGHT_DTYPE_BYTES); only a simulated
    run priced by the roofline reads it, so anything else keeps ``auto``."""
    from kvbench.harness.kv.sizes import WEIGHT_DTYPE_BYTES

    one_of("weight_dtype", cfg.weight_dtype, ("auto", *WEIGHT_DTYPE_BYTES))
    if cfg.weight_dtype == "auto":
        return
    check(cfg.gpu is not None and cfg.scenario.bookkeeping and cfg.clock_profile is None,
         f"weight_dtype={cfg.weight_dtype} prices the weights on the simulated clock's roofline: it needs gpu=NAME and "
         f"a bookkeeping scenario (scenario=capacity, or a search with scenario.probe=capacity) and no clock_profile "
         f"(a profile measured its own weights); scenario={cfg.scenario.name}, gpu="
         f"{cfg.gpu.name if cfg.gpu is not None else None}, clock_profile={cfg.clock_profile}. Leave it auto")


def _power_of_two_block(bs: int) -> bool:
    return 1 <= bs <= MAX_BLOCK_SIZE and bs & (bs - 1) == 0


def validate_scenario(cfg: Config) -> None:
    sc = cfg.scenario
    one_of("scenario.name", sc.name, schemas())
    chosen = next((name for name, schema in schemas().items() if type(sc) is schema), None)
    check(chosen == sc.name, f"scenario.name={sc.name!r} only relabels the rows (the keys and the run stay those of "
                            f"scenario={chosen}); choose the scenario with scenario={sc.name}")
    if isinstance(sc, SearchScenario):
        one_of("scenario.probe", sc.probe, PROBES)
    # Checked here, before the device is looked for: on any device, a scenario that runs no model decode
    # would take cuda_graph=true silently and change nothing but the rows' label.
    check(not cfg.cuda_graph or _decodes_with_model(sc),
         f"cuda_graph=true does nothing in scenario={sc.name}" + (f" with scenario.probe={sc.probe}"
                                                                  if isinstance(sc, SearchScenario) else "")
         + ": it applies to scenario=decode, and max_concurrency/max_rate with scenario.probe=decode; leave it false")
    check(not cfg.cpu_compile or _decodes_with_model(sc),
         f"cpu_compile=true does nothing in scenario={sc.name}" + (f" with scenario.probe={sc.probe}"
                                                                   if isinstance(sc, SearchScenario) else "")
         + ": it applies to scenario=decode, and max_concurrency/max_rate with scenario.probe=decode; leave it null")
    if isinstance(sc, KernelScenario):
        check(sc.context_len >= 1, f"scenario.context_len={sc.context_len} must be >= 1")
        check(sc.warmup >= 0, f"scenario.warmup={sc.warmup} must be >= 0")
        check(sc.iters >= 1, f"scenario.iters={sc.iters} must be >= 1")
        check(sc.slab_block_size is None or _power_of_two_block(sc.slab_block_size),
             f"scenario.slab_block_size={sc.slab_block_size} must be a block_size (a power of two in "
             f"[1, {MAX_BLOCK_SIZE}]) or null")


def _decodes_with_model(sc) -> bool:
    """The scenario runs the model's decode steps (where cuda_graph's pieces replace its forward)."""
    return isinstance(sc, DecodeScenario) or (isinstance(sc, SearchScenario) and sc.probe == "decode")


def validate_impl(impl: ImplConfig) -> None:
    # The registries load no torch (it is imported where tensors are built).
    from kvbench.impls.eviction import POLICIES
    from kvbench.impls.kinds import CONTIGUOUS_RESERVATIONS, KINDS, cache_kind
    from kvbench.kernels.registry import KERNELS, is_plugin, plugin_module

    one_of("impl.cache", impl.cache, tuple(KINDS))
    if impl.kernel == "native" and impl.cache == "paged":
        return  # +impl=paged: the device's kernel, chosen once the device is known (harness/front/native.py)
    if is_plugin(impl.kernel):  # a kernel module by dotted path (kernels/registry.py)
        module = plugin_module(impl.kernel)
        check(importlib.util.find_spec(module.rsplit(".", 1)[0]) is not None
             and importlib.util.find_spec(module) is not None,
             f"impl.kernel={impl.kernel!r}: no such module on the Python path; "
             f"allowed: {', '.join(KERNELS)}, or a kernel module's dotted path")
    else:
        one_of("impl.kernel", impl.kernel, KERNELS)
    one_of("impl.reservation", impl.reservation, tuple(CONTIGUOUS_RESERVATIONS))
    one_of("impl.eviction", impl.eviction, POLICIES)
    try:
        kind = cache_kind(impl.cache, impl.reservation)
    except KeyError:  # a reservation policy of a cache that allocates as tokens arrive
        raise ConfigError(f"impl.reservation={impl.reservation!r} does not apply to impl.cache={impl.cache!r}, "
                          "which allocates as tokens arrive (allowed: max)") from None
    kind_error = kind.kernel_error(impl.kernel)
    check(kind_error is None, f"impl.kernel={impl.kernel!r} does not fit impl.cache={impl.cache!r}: {kind_error}")

