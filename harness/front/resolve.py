"""Turn the composed config into a concrete, validated one (once, at the entry point).

Resolves the ``auto`` choices (device, dtype, model), fills defaults that depend
on other keys, and checks every key, raising ``ConfigError`` with the key's name
and the allowed values. The keys that do not depend on the device are checked
first; torch is imported only to ask about a GPU (kernels/cuda_available.py: not at
all on a CPU-only build) and by the impl registries, so most bad values fail fast.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import math
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from harness.kv.budget import check_host_workload, check_memory_bounds, check_memory_values
from harness.kv.factory import check_host_memory, check_kernel_pool
from harness.config import (
    ARRIVALS, DEVICES, DISTRIBUTIONS, DTYPES, ISOLATIONS, MAX_BLOCK_SIZE, PROBES, RATE_ARRIVALS, THINK_DISTRIBUTIONS,
    TRACE_FORMATS, TRACE_SAMPLES, WORKLOAD_KINDS, Config,
    GpuConfig, ImplConfig, SearchScenario,
)
from harness.scenarios import schemas
from harness.scenarios.decode import DecodeScenario
from harness.scenarios.kernel import KernelScenario
from harness.scenarios.max_rate import MaxRateScenario
from harness.serving.cost_model import GpuSpec, gpu_spec
from kernels.cuda_available import cuda_available
from kernels.kv_formats import KV_DTYPES, KV_SCALES
from harness.errors import INT64_MAX, ConfigError
from harness.kv.sizes import GB, weight_bytes
from harness.model.hf_config import resolve_model_config
from harness.model.config import ModelConfig
from harness.front.strict import check_known_keys, check_model_name, hydra_choice
from harness.paths import CONF_DIR

CPU_MODEL, GPU_MODEL = "tiny-llama", "llama-3.1-8b"
CPU_MEMORY_GB = 0.25


def _choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def load_group(group: str, name: str, schema: type):
    """One option of a config group, merged over its dataclass (used for ``auto``)."""
    path = CONF_DIR / group / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"{group}={name} is unknown; allowed: {', '.join(_choices(group))}")
    return _load(path, schema)


def _load(path: Path, schema: type):
    """A config file merged over its dataclass (type-checked), as a dataclass instance."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.load(path)))


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _one_of(key: str, value: str, allowed) -> None:
    _check(value in allowed, f"{key}={value!r} is not allowed; allowed: {', '.join(map(str, allowed))}")


def check_int_ranges(node: object, prefix: str = "") -> None:
    """Every integer key of the config (nested groups and lists too) fits the rows' int64 columns."""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_int_ranges(value, f"{key}.")
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, int) and not isinstance(item, bool) and not -INT64_MAX - 1 <= item <= INT64_MAX:
                raise ConfigError(f"{key}={item} is out of range: an integer key is at most {INT64_MAX} (int64)")


def check_finite_floats(node: object, prefix: str = "") -> None:
    """Every float key of the config (nested groups and lists too) is finite: inf and nan size nothing.

    Runs after the keys' own checks (whose messages say more), before any value sizes anything."""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_finite_floats(value, f"{key}.")
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{key}={item} must be a finite number")


def to_config(cfg: DictConfig | Config) -> Config:
    if not isinstance(cfg, DictConfig):
        return copy.deepcopy(cfg)
    from omegaconf.errors import InterpolationResolutionError

    try:
        return OmegaConf.to_object(cfg)
    except InterpolationResolutionError as e:  # ${oc.env:NOPE}, ${nope}: resolved only now
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{e.full_key}: its interpolation cannot be resolved: {reason}") from None


def resolve(raw: DictConfig | Config) -> Config:
    if isinstance(raw, DictConfig):  # what Hydra lets through: +unknown keys, a relabelled model
        check_known_keys(raw)
        check_model_name(raw, hydra_choice("model"))
    cfg = to_config(raw)
    check_int_ranges(cfg)  # before any value is used: a row's integer columns are int64
    _one_of("device.name", cfg.device.name, DEVICES)
    if cfg.dtype != "auto":
        _one_of("dtype", cfg.dtype, DTYPES)
    _one_of("isolation", cfg.isolation, ISOLATIONS)
    _one_of("kv_dtype", cfg.kv_dtype, KV_DTYPES)
    _one_of("kv_scale", cfg.kv_scale, KV_SCALES)
    if cfg.kv_dtype == "auto":  # a float store has no scales: one job (the default's identity) whatever kv_scale says
        cfg.kv_scale = "tensor"
    if isinstance(cfg.scenario, MaxRateScenario) and cfg.arrival.rate is None:
        cfg.arrival.rate = cfg.scenario.start_rps  # the search sets it per probe; the row's digest is the first's
    if cfg.workload.kind == "multi_turn" and cfg.workload.num_requests is None:
        cfg.workload.num_requests = cfg.workload.users * cfg.workload.turns  # checked in validate_reuse_keys
    if cfg.workload.num_requests is None and cfg.workload.distribution != "trace":
        cfg.workload.num_requests = cfg.batch  # a trace's default is its file's row count (describe_trace)
    validate(cfg)  # the keys that do not depend on the device, before the device is looked for
    if cfg.device.name == "auto":
        cfg.device.name = "cuda" if cuda_available() else "cpu"
    _check(cfg.device.name != "cuda" or cuda_available(), "device.name=cuda but no CUDA GPU is visible")
    _check(not cfg.cuda_graph or cfg.device.name == "cuda",
           f"cuda_graph=true needs a CUDA device (CUDA graphs record GPU work); device={cfg.device.name}: leave it false")
    _check(not cfg.cpu_compile or cfg.device.name == "cpu",
           f"cpu_compile=true compiles the CPU decode forward; device={cfg.device.name}: leave it null or false "
           "(cuda_graph=true is the GPU's way)")
    if cfg.dtype == "auto":  # a simulated GPU counts as a GPU
        cfg.dtype = "bfloat16" if cfg.device.name == "cuda" or _simulated_gpu(cfg) else "float32"
    _check(not cfg.cpu_fused or (cfg.device.name == "cpu" and cfg.dtype == "float32"),
           f"cpu_fused=true runs fused float32 CPU ops; device={cfg.device.name} dtype={cfg.dtype}: leave it null "
           "or false")
    if cfg.isolation == "auto":
        cfg.isolation = "process" if cfg.device.name == "cuda" else "none"
    if cfg.model.name == "auto" and not cfg.model.path:
        cfg.model = load_group("model", GPU_MODEL if cfg.device.name == "cuda" else CPU_MODEL, ModelConfig)
    cfg.model = resolve_model_config(cfg.model)
    if cfg.gpu is not None:
        _resolve_gpu(cfg)
    if cfg.device.name == "cpu" and cfg.device.memory_gb is None:
        cfg.device.memory_gb = CPU_MEMORY_GB
    gpu_total = _gpu_total_bytes() if cfg.device.name == "cuda" else None
    check_memory_bounds(cfg, gpu_total)
    if cfg.workload.distribution == "trace":
        describe_trace(cfg)
    import psutil  # the RAM free now: what every part of the run will be built in

    free = psutil.virtual_memory().available
    check_host_workload(cfg, free)
    check_host_memory(cfg, free, gpu_total)  # the host tier, the paged pool's bookkeeping
    if isinstance(cfg.scenario, KernelScenario):
        check_kernel_pool(cfg, free, gpu_total)
    return cfg


def _gpu_total_bytes() -> int:
    import torch  # only a run on the GPU asks, and it loads torch anyway

    return torch.cuda.get_device_properties(0).total_memory


def describe_trace(cfg: Config) -> None:
    """Read the trace once here, so a bad file is a config error before the run starts, and
    record the selected requests' mean lengths as ``workload.prompt_len``/``output_len``, and
    their count as ``workload.num_requests`` when it was left unset (every row of the file)."""
    from harness.serving.hash_blocks import check_hash_block_size
    from harness.serving.trace import read_trace

    w = cfg.workload
    trace = read_trace(w, w.num_requests, cfg.seed)
    if w.num_requests is None:
        w.num_requests = len(trace.prompt_lens)
    _check(cfg.arrival.name != "trace" or trace.arrival_s is not None,
           f"arrival=trace needs arrival times, but workload.path={w.path!r} has no "
           f"workload.columns.arrival_s={w.columns.arrival_s!r} column")
    if trace.hash_ids is not None:  # format=mooncake: the blocks its hash ids name
        check_hash_block_size(w.hash_block_size, cfg.max_seq_len, int(trace.prompt_lens.max()))
    w.prompt_len = round(float(trace.prompt_lens.mean()), 2)
    w.output_len = round(float(trace.output_lens.mean()), 2)


def _simulated_gpu(cfg: Config) -> bool:
    """A GPU spec is chosen and the scenario runs bookkeeping only (no real device memory)."""
    return cfg.gpu is not None and cfg.scenario.bookkeeping


def _resolve_gpu(cfg: Config) -> None:
    """Fill the chosen GPU's figures from conf/gpu/NAME.yaml (a key already set wins) and check them.

    In a bookkeeping scenario the GPUs' total memory is the default ``device.memory_gb``,
    and it must at least hold the weights.
    """
    gpu = cfg.gpu
    _one_of("gpu.name", gpu.name, _choices("gpu"))
    spec_file = load_group("gpu", gpu.name, GpuConfig)
    for key in GpuSpec.field_names():
        if getattr(gpu, key) is None:
            setattr(gpu, key, getattr(spec_file, key))
    spec = gpu_spec(gpu)  # a figure <= 0 is a ConfigError naming its key
    if not _simulated_gpu(cfg) or cfg.device.memory_gb is not None:
        return
    cfg.device.memory_gb = spec.memory_gb * spec.count
    usable = cfg.device.memory_gb * cfg.device.utilization
    weights = weight_bytes(cfg.model, cfg.dtype) / GB
    _check(weights < usable,
           f"gpu={gpu.name} x gpu.count={spec.count}: {usable:.1f} GB usable ({cfg.device.memory_gb:g} GB x "
           f"device.utilization={cfg.device.utilization}) cannot hold the weights of model={cfg.model.name} "
           f"({weights:.1f} GB, dtype={cfg.dtype}); raise gpu.count")


def validate(cfg: Config) -> None:
    validate_scenario(cfg)
    _check(cfg.batch >= 1, f"batch={cfg.batch} must be >= 1")
    _check(cfg.max_num_batched_tokens >= 1, f"max_num_batched_tokens={cfg.max_num_batched_tokens} must be >= 1")
    _check(not cfg.chunked_prefill or cfg.max_num_batched_tokens >= cfg.batch,
           f"chunked_prefill=true: max_num_batched_tokens={cfg.max_num_batched_tokens} must be >= batch={cfg.batch} "
           f"(every step's token budget holds one decode token per running sequence)")
    _check(cfg.repeat >= 1, f"repeat={cfg.repeat} must be >= 1")
    _check(cfg.seed >= 0, f"seed={cfg.seed} must be >= 0")  # numpy's generators take no negative seed
    _check(cfg.cpu_threads is None or cfg.cpu_threads >= 1, f"cpu_threads={cfg.cpu_threads} must be >= 1 (or null: the cores free at the job's start)")
    cpus = os.cpu_count() or 1  # a bookkeeping run computes on no thread: it only records the number
    _check(cfg.cpu_threads is None or cfg.scenario.bookkeeping or cfg.cpu_threads <= cpus,
           f"cpu_threads={cfg.cpu_threads} must be in [1, {cpus}] (this machine's logical CPUs; more only wait on "
           "each other), or null: the cores free at the job's start")
    _check(cfg.max_seq_len >= 2, f"max_seq_len={cfg.max_seq_len} must be >= 2")
    bs = cfg.block_size
    _check(_power_of_two_block(bs),
           f"block_size={bs} must be a power of two in [1, {MAX_BLOCK_SIZE}] (1, 2, 4, ..., {MAX_BLOCK_SIZE})")
    d = cfg.device
    _check(0 < d.utilization <= 1, f"device.utilization={d.utilization} must be in (0, 1]")
    check_memory_values(cfg)  # their bounds need the device (check_memory_bounds, in resolve)
    _check(0 <= d.watermark < 1, f"device.watermark={d.watermark} must be in [0, 1)")
    _check(d.host_kv_gb is None or 0 <= d.host_kv_gb < float("inf"),
           f"device.host_kv_gb={d.host_kv_gb} must be >= 0 and finite (null or 0: no host tier)")
    _one_of("preemption", cfg.preemption, ("recompute", "swap"))
    _one_of("host_copy", cfg.host_copy, ("batched", "per_block"))
    _check(cfg.preemption != "swap" or bool(d.host_kv_gb),
           f"preemption=swap copies a victim's blocks to the host tier: set device.host_kv_gb > 0 "
           f"(device.host_kv_gb={d.host_kv_gb})")
    w = cfg.workload
    _one_of("workload.distribution", w.distribution, DISTRIBUTIONS)
    validate_reuse_keys(cfg)  # first: a multi_turn run's num_requests comes from its users and turns
    _check(w.num_requests is None or w.num_requests >= 1,  # None: a trace's every row (describe_trace)
           f"workload.num_requests={w.num_requests} must be >= 1")
    _check(w.prompt_len >= 1, f"workload.prompt_len={w.prompt_len} must be >= 1")
    _check(w.output_len >= 1, f"workload.output_len={w.output_len} must be >= 1")
    _check(w.n >= 1, f"workload.n={w.n} must be >= 1")
    _check(0 <= w.shared_prefix_len < cfg.max_seq_len,
           f"workload.shared_prefix_len={w.shared_prefix_len} must be in [0, max_seq_len={cfg.max_seq_len})")
    _check(w.sigma > 0, f"workload.sigma={w.sigma} must be > 0")
    _check(0 <= w.spread < 1, f"workload.spread={w.spread} must be in [0, 1)")
    if w.distribution == "fixed":
        _check(float(w.prompt_len).is_integer() and float(w.output_len).is_integer(),
               f"workload.prompt_len={w.prompt_len:g} and workload.output_len={w.output_len:g} "
               "must be whole numbers for workload.distribution=fixed")
        total = w.prompt_len + w.output_len
        _check(total <= cfg.max_seq_len,
               f"a request of workload.prompt_len + workload.output_len = {total:g} tokens "
               f"is longer than max_seq_len={cfg.max_seq_len}")
    validate_trace_keys(cfg)
    validate_arrival(cfg)
    validate_slo(cfg)
    validate_clock_profile(cfg)
    if cfg.impl is not None:
        validate_impl(cfg.impl)
    check_finite_floats(cfg)  # last: the keys' own checks above say more


def validate_clock_profile(cfg: Config) -> None:
    """clock_profile=PATH: a readable profile table (its impl is checked when the impl runs)."""
    if cfg.clock_profile is None:
        _check(cfg.clock_profile_impl is None, "clock_profile_impl needs clock_profile=RUN_DIR (a scenario=profile run)")
        _check(not cfg.clock_profile_allow_mismatch,
               "clock_profile_allow_mismatch needs clock_profile=RUN_DIR (a scenario=profile run)")
        return
    _check(cfg.scenario.bookkeeping,
           f"clock_profile prices simulated steps; scenario={cfg.scenario.name} runs on the wall clock "
           "(use it with scenario=capacity, or scenario=max_rate / max_concurrency with scenario.probe=capacity)")
    from harness.serving.profile_table import read_profile_table

    read_profile_table(Path(cfg.clock_profile))  # one line naming the problem, before any job starts


def _power_of_two_block(bs: int) -> bool:
    return 1 <= bs <= MAX_BLOCK_SIZE and bs & (bs - 1) == 0


def validate_scenario(cfg: Config) -> None:
    sc = cfg.scenario
    _one_of("scenario.name", sc.name, schemas())
    chosen = next((name for name, schema in schemas().items() if type(sc) is schema), None)
    _check(chosen == sc.name, f"scenario.name={sc.name!r} only relabels the rows (the keys and the run stay those of "
                              f"scenario={chosen}); choose the scenario with scenario={sc.name}")
    if isinstance(sc, SearchScenario):
        _one_of("scenario.probe", sc.probe, PROBES)
    # Checked here, before the device is looked for: on any device, a scenario that runs no model decode
    # would take cuda_graph=true silently and change nothing but the rows' label.
    _check(not cfg.cuda_graph or _decodes_with_model(sc),
           f"cuda_graph=true does nothing in scenario={sc.name}" + (f" with scenario.probe={sc.probe}"
                                                                    if isinstance(sc, SearchScenario) else "")
           + ": it applies to scenario=decode, and max_concurrency/max_rate with scenario.probe=decode; leave it false")
    _check(not cfg.cpu_compile or _decodes_with_model(sc),
           f"cpu_compile=true does nothing in scenario={sc.name}" + (f" with scenario.probe={sc.probe}"
                                                                     if isinstance(sc, SearchScenario) else "")
           + ": it applies to scenario=decode, and max_concurrency/max_rate with scenario.probe=decode; leave it null")
    if isinstance(sc, KernelScenario):
        _check(sc.context_len >= 1, f"scenario.context_len={sc.context_len} must be >= 1")
        _check(sc.warmup >= 0, f"scenario.warmup={sc.warmup} must be >= 0")
        _check(sc.iters >= 1, f"scenario.iters={sc.iters} must be >= 1")
        _check(sc.slab_block_size is None or _power_of_two_block(sc.slab_block_size),
               f"scenario.slab_block_size={sc.slab_block_size} must be a block_size (a power of two in "
               f"[1, {MAX_BLOCK_SIZE}]) or null")


def _decodes_with_model(sc) -> bool:
    """The scenario runs the model's decode steps (where cuda_graph's pieces replace its forward)."""
    return isinstance(sc, DecodeScenario) or (isinstance(sc, SearchScenario) and sc.probe == "decode")


def slo_set(cfg: Config) -> bool:
    return any(getattr(cfg.slo, k) is not None for k in ("ttft_ms", "tpot_ms", "e2el_ms", "normalized_latency_s"))


def validate_slo(cfg: Config) -> None:
    slo = cfg.slo
    _check(0 < slo.percentile <= 100, f"slo.percentile={slo.percentile} must be in (0, 100]")
    for key in ("ttft_ms", "tpot_ms", "e2el_ms", "normalized_latency_s"):
        value = getattr(slo, key)
        _check(value is None or value > 0, f"slo.{key}={value} must be > 0 (or null: not checked)")
    if cfg.scenario.bookkeeping and cfg.gpu is None and cfg.clock_profile is None:
        _check(cfg.arrival.name == "burst" and not slo_set(cfg),
               f"arrival={cfg.arrival.name} and slo={cfg.slo.name} need a clock: the bookkeeping runs "
               f"(scenario=capacity, scenario.probe=capacity) take the simulated one from gpu=NAME "
               f"({', '.join(_choices('gpu'))}) or from a measured profile, clock_profile=RUN_DIR "
               "(scenario=profile makes one)")
    if cfg.scenario.name != "max_rate":
        return
    _check(slo_set(cfg),
           "scenario=max_rate needs an SLO with a limit: slo=NAME (" + ", ".join(_choices("slo")) +
           ") or slo.ttft_ms / slo.tpot_ms / slo.e2el_ms / slo.normalized_latency_s")
    _one_of("arrival.name (scenario=max_rate searches over arrival.rate)", cfg.arrival.name, RATE_ARRIVALS)
    sc = cfg.scenario
    _check(sc.start_rps > 0, f"scenario.start_rps={sc.start_rps} must be > 0")
    _check(sc.tolerance_rps > 0, f"scenario.tolerance_rps={sc.tolerance_rps} must be > 0")
    _check(sc.search_limit >= sc.start_rps,
           f"scenario.search_limit={sc.search_limit} must be >= scenario.start_rps={sc.start_rps}")


def validate_trace_keys(cfg: Config) -> None:
    """The workload=trace keys that need no file; harness/serving/trace.py checks the file itself."""
    w = cfg.workload
    _one_of("workload.sample", w.sample, TRACE_SAMPLES)
    if w.distribution == "trace":
        _check(bool(w.path), "workload.path must name a CSV, JSONL or parquet file for workload=trace "
                             "(workload.distribution=trace)")
    elif w.distribution == "text":
        _check(bool(w.path), "workload.path must name a local text file for workload=text (workload.distribution=text)")
        _check(bool(cfg.model.path), "workload=text tokenizes the file with the checkpoint's own tokenizer: set "
                                     "model.path=DIR (a Hugging Face checkpoint folder with tokenizer.json)")
        _check(cfg.scenario.name == "decode", f"workload=text runs in scenario=decode (its perplexity and teacher-"
                                              f"forced accuracy need a model), not scenario={cfg.scenario.name}")
        _check(w.kind == "plain" and w.n == 1 and w.shared_prefix_len == 0,
               "workload=text takes its prompts from the text: leave workload.kind, workload.n and "
               "workload.shared_prefix_len at their defaults")
    else:
        _check(w.path is None, f"workload.path={w.path!r} is read only by workload=trace or workload=text "
                               f"(workload.distribution=trace|text), not workload.distribution={w.distribution}")


CLOSED_LOOP_SCENARIOS = ("decode", "capacity")  # the scenarios whose runs take a request source


def validate_reuse_keys(cfg: Config) -> None:
    """workload.kind and its keys (harness/serving/conversations.py, system_prompts.py), and
    workload.format (harness/serving/trace.py)."""
    w = cfg.workload
    _one_of("workload.kind", w.kind, WORKLOAD_KINDS)
    _one_of("workload.format", w.format, TRACE_FORMATS)
    _one_of("workload.think_distribution", w.think_distribution, THINK_DISTRIBUTIONS)
    _check(w.users >= 1, f"workload.users={w.users} must be >= 1")
    _check(w.turns >= 1, f"workload.turns={w.turns} must be >= 1")
    _check(math.isfinite(w.think_time_s) and w.think_time_s >= 0,
           f"workload.think_time_s={w.think_time_s} must be >= 0 seconds")
    _check(w.system_prompts >= 1, f"workload.system_prompts={w.system_prompts} must be >= 1")
    _check(math.isfinite(w.zipf_exponent) and w.zipf_exponent >= 0,
           f"workload.zipf_exponent={w.zipf_exponent} must be >= 0 (0: every system prompt equally popular)")
    _check(w.hash_block_size >= 1, f"workload.hash_block_size={w.hash_block_size} must be >= 1 token")
    if w.format == "mooncake":
        _check(w.distribution == "trace", f"workload.format=mooncake is a trace file's format: it needs "
                                          f"workload.distribution=trace (workload=mooncake), not {w.distribution}")
        _check(w.shared_prefix_len == 0, f"workload.shared_prefix_len={w.shared_prefix_len}: workload.format=mooncake "
                                         "takes every prompt token from the trace's hash_ids")
    if w.kind == "plain":
        return
    _check(w.distribution != "trace", f"workload.kind={w.kind} draws its own prompts; "
                                      "workload.distribution=trace is for workload.kind=plain")
    _check(w.shared_prefix_len == 0, f"workload.shared_prefix_len={w.shared_prefix_len} is for workload.kind=plain; "
                                     f"workload.kind={w.kind} shares its own prefixes")
    if w.kind == "system_prompt":
        _check(1 <= w.system_prompt_len <= cfg.max_seq_len - 2,
               f"workload.system_prompt_len={w.system_prompt_len} must be in [1, max_seq_len - 2 = "
               f"{cfg.max_seq_len - 2}] (a user token and an output token must fit after it)")
        return
    # multi_turn: a closed loop, which the decode and capacity scenarios run (both clocks)
    _check(w.n == 1, f"workload.n={w.n}: workload.kind=multi_turn has one answer per turn (n=1)")
    _check(w.num_requests == w.users * w.turns,
           f"workload.num_requests={w.num_requests} must equal workload.users x workload.turns = "
           f"{w.users * w.turns} for workload.kind=multi_turn (leave it unset)")
    _check(cfg.scenario.name in CLOSED_LOOP_SCENARIOS,
           f"workload.kind=multi_turn (closed-loop arrivals) runs in scenario={'|'.join(CLOSED_LOOP_SCENARIOS)}, "
           f"not scenario={cfg.scenario.name}")
    _check(cfg.arrival.name != "trace", "arrival=trace needs a trace file; workload.kind=multi_turn times its "
                                        "first turns by burst, poisson, gamma or constant arrivals")


def validate_arrival(cfg: Config) -> None:
    a = cfg.arrival
    _one_of("arrival.name", a.name, ARRIVALS)
    _check(a.rate is None or (math.isfinite(a.rate) and a.rate > 0),
           f"arrival.rate={a.rate} must be > 0 requests per second")
    _check(a.name not in RATE_ARRIVALS or a.rate is not None,
           f"arrival={a.name} needs arrival.rate (requests per second, > 0)")
    _check(math.isfinite(a.burstiness) and a.burstiness > 0,
           f"arrival.burstiness={a.burstiness} must be > 0 (1 is Poisson, smaller is burstier)")
    _check(math.isfinite(a.time_scale) and a.time_scale > 0, f"arrival.time_scale={a.time_scale} must be > 0")
    _check(a.name != "trace" or cfg.workload.distribution == "trace",
           f"arrival=trace needs arrival times from a file (workload=trace with a workload.columns.arrival_s "
           f"column); workload={cfg.workload.name} has none")


def validate_impl(impl: ImplConfig) -> None:
    # The registries load no torch (it is imported where tensors are built).
    from impls.eviction import POLICIES
    from impls.kinds import CONTIGUOUS_RESERVATIONS, KINDS, cache_kind
    from kernels.registry import KERNELS, is_plugin

    _one_of("impl.cache", impl.cache, tuple(KINDS))
    if is_plugin(impl.kernel):  # a kernel module by dotted path (kernels/registry.py)
        _check(importlib.util.find_spec(impl.kernel.rsplit(".", 1)[0]) is not None
               and importlib.util.find_spec(impl.kernel) is not None,
               f"impl.kernel={impl.kernel!r}: no such module on the Python path; "
               f"allowed: {', '.join(KERNELS)}, or a kernel module's dotted path")
    else:
        _one_of("impl.kernel", impl.kernel, KERNELS)
    _one_of("impl.reservation", impl.reservation, tuple(CONTIGUOUS_RESERVATIONS))
    _one_of("impl.eviction", impl.eviction, POLICIES)
    try:
        kind = cache_kind(impl.cache, impl.reservation)
    except KeyError:  # a reservation policy of a cache that allocates as tokens arrive
        raise ConfigError(f"impl.reservation={impl.reservation!r} does not apply to impl.cache={impl.cache!r}, "
                          "which allocates as tokens arrive (allowed: max)") from None
    kind_error = kind.kernel_error(impl.kernel)
    _check(kind_error is None, f"impl.kernel={impl.kernel!r} does not fit impl.cache={impl.cache!r}: {kind_error}")


def impl_dirs() -> list[Path]:
    """conf/impl/, then the impl/ folder of every other config source on Hydra's search path
    (``hydra.searchpath=[file://DIR]``) when a Hydra app is running."""
    dirs = [CONF_DIR / "impl"]
    try:
        from hydra.core.hydra_config import HydraConfig

        sources = HydraConfig.get().runtime.config_sources
    except ValueError:  # not inside a Hydra app (a test calling run_job directly)
        sources = []
    for source in sources:
        if source.schema == "file" and (Path(source.path) / "impl").is_dir():
            dirs.append(Path(source.path) / "impl")
    return list(dict.fromkeys(d.resolve() for d in dirs))


def impl_names() -> list[str]:
    """Every impl on the search path, each once: an alias (conf/impl/paged.yaml, a file that
    composes another impl through its defaults list) has no ``name`` of its own and is skipped."""
    names = []
    for folder in impl_dirs():
        for path in sorted(folder.glob("*.yaml")):
            if OmegaConf.load(path).get("name") == path.stem and path.stem not in names:
                names.append(path.stem)
    return names


def load_impl(name: str) -> ImplConfig:
    """An impl's config by name; an alias (a defaults list naming its target) gives its target's."""
    for folder in impl_dirs():
        path = folder / f"{name}.yaml"
        if path.exists():
            raw = OmegaConf.load(path)
            if "name" not in raw and raw.get("defaults"):
                return load_impl(str(raw.defaults[0]))
            return _load(path, ImplConfig)
    raise ConfigError(f"impl={name} is unknown; allowed: {', '.join(impl_names())}")


def impls_to_run(cfg: Config) -> list[ImplConfig]:
    """The chosen impl, or every impl on the search path (one row each)."""
    if cfg.impl is not None:
        return [cfg.impl]
    return [load_impl(name) for name in impl_names()]
