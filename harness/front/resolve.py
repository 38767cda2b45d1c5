"""Turn the composed config into a concrete, validated one (once, at the entry point).

Resolves the ``auto`` choices (device, dtype, model), fills defaults that depend
on other keys, and checks every key, raising ``ConfigError`` with the key's name
and the allowed values. The keys that do not depend on the device are checked
first (harness/front/validate.py, validate_workload.py); torch is imported only to ask about a GPU
(kernels/cuda_available.py: not at all on a CPU-only build) and by the impl registries, so most bad values
fail fast. The options of conf/'s groups and the impls are read in harness/front/groups.py.
"""

from __future__ import annotations

import copy
import dataclasses

from omegaconf import DictConfig, OmegaConf

from kvbench.harness.config import DEFAULT_TOKEN_BUDGET, DEVICES, DTYPES, ISOLATIONS, Config, EngineConfig, GpuConfig
from kvbench.harness.errors import ConfigError
from kvbench.harness.front.checks import check, check_int_ranges, choices, one_of
from kvbench.harness.front.groups import load_group
from kvbench.harness.front.strict import check_known_keys, check_model_name, hydra_choice
from kvbench.harness.front.native import resolve_native
from kvbench.harness.front.validate import validate, validate_impl
from kvbench.harness.kv.budget import check_host_workload, check_memory_bounds
from kvbench.harness.kv.factory import check_host_memory, check_kernel_pool
from kvbench.harness.kv.sizes import GB, stored_weight_bytes
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.support import compute_refusal
from kvbench.harness.scenarios.kernel import KernelScenario
from kvbench.harness.scenarios.max_rate import MaxRateScenario
from kvbench.harness.serving.cost_model import GpuSpec, gpu_spec
from kvbench.harness.serving.engine_profile import DEFAULT_ENGINE, engine_spec, is_offline, token_budget
from kvbench.kernels.cuda_available import cuda_available
from kvbench.kernels.kv_formats import KV_DTYPES, KV_SCALES

CPU_MODEL, GPU_MODEL = "tiny-llama", "llama-3.1-8b"
CPU_MEMORY_GB = 0.25


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
    one_of("device.name", cfg.device.name, DEVICES)
    if cfg.dtype != "auto":
        one_of("dtype", cfg.dtype, DTYPES)
    one_of("isolation", cfg.isolation, ISOLATIONS)
    one_of("kv_dtype", cfg.kv_dtype, KV_DTYPES)
    one_of("kv_scale", cfg.kv_scale, KV_SCALES)
    if cfg.kv_dtype == "auto":  # a float store has no scales: one job (the default's identity) whatever kv_scale says
        cfg.kv_scale = "tensor"
    if isinstance(cfg.scenario, MaxRateScenario) and cfg.arrival.rate is None:
        cfg.arrival.rate = cfg.scenario.start_rps  # the search sets it per probe; the row's digest is the first's
    if cfg.workload.kind == "multi_turn" and cfg.workload.num_requests is None:
        cfg.workload.num_requests = cfg.workload.users * cfg.workload.turns  # checked in validate_reuse_keys
    if cfg.workload.num_requests is None and cfg.workload.distribution != "trace":
        cfg.workload.num_requests = cfg.batch  # a trace's default is its file's row count (describe_trace)
    if cfg.gpu is not None:  # once, first: the engine's token budget is the card's, _resolve_gpu checks the rest
        _fill_gpu(cfg.gpu)
    _resolve_engine(cfg)  # before validate: the engine's chunked_prefill default is checked there
    validate(cfg)  # the keys that do not depend on the device, before the device is looked for
    if cfg.device.name == "auto":
        cfg.device.name = "cuda" if cuda_available() else "cpu"
    check(cfg.device.name != "cuda" or cuda_available(), "device.name=cuda but no CUDA GPU is visible")
    check(not cfg.cuda_graph or cfg.device.name == "cuda",
          f"cuda_graph=true needs a CUDA device (CUDA graphs record GPU work); device={cfg.device.name}: leave it false")
    check(not cfg.cpu_compile or cfg.device.name == "cpu",
          f"cpu_compile=true compiles the CPU decode forward; device={cfg.device.name}: leave it null or false "
          "(cuda_graph=true is the GPU's way)")
    if resolve_native(cfg):  # +impl=paged: the device's own paged kernel (harness/front/native.py)
        validate_impl(cfg.impl)
    if cfg.dtype == "auto":  # a simulated GPU counts as a GPU
        cfg.dtype = "bfloat16" if cfg.device.name == "cuda" or _simulated_gpu(cfg) else "float32"
    if cfg.weight_dtype == cfg.dtype:  # weights at the run's dtype: one job (the default's identity), as kv_scale
        cfg.weight_dtype = "auto"
    check(not cfg.cpu_fused or (cfg.device.name == "cpu" and cfg.dtype == "float32"),
          f"cpu_fused=true runs fused float32 CPU ops; device={cfg.device.name} dtype={cfg.dtype}: leave it null "
          "or false")
    if cfg.isolation == "auto":
        cfg.isolation = "process" if cfg.device.name == "cuda" else "none"
    if cfg.model.name == "auto" and not cfg.model.path:
        cfg.model = load_group("model", GPU_MODEL if cfg.device.name == "cuda" else CPU_MODEL, ModelConfig)
    cfg.model = resolve_model_config(cfg.model)
    if not cfg.scenario.bookkeeping and not isinstance(cfg.scenario, KernelScenario):  # runs the model
        refusal = compute_refusal(cfg.model)
        check(refusal is None, str(refusal))
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
    from kvbench.harness.serving.hash_blocks import check_hash_block_size
    from kvbench.harness.serving.trace import read_trace

    w = cfg.workload
    trace = read_trace(w, w.num_requests, cfg.seed)
    if w.num_requests is None:
        w.num_requests = len(trace.prompt_lens)
    check(cfg.arrival.name != "trace" or trace.arrival_s is not None,
          f"arrival=trace needs arrival times, but workload.path={w.path!r} has no "
          f"workload.columns.arrival_s={w.columns.arrival_s!r} column")
    if trace.hash_ids is not None:  # format=mooncake: the blocks its hash ids name
        check_hash_block_size(w.hash_block_size, cfg.max_seq_len, int(trace.prompt_lens.max()))
    w.prompt_len = round(float(trace.prompt_lens.mean()), 2)
    w.output_len = round(float(trace.output_lens.mean()), 2)


def _simulated_gpu(cfg: Config) -> bool:
    """A GPU spec is chosen and the scenario runs bookkeeping only (no real device memory)."""
    return cfg.gpu is not None and cfg.scenario.bookkeeping


# What device.utilization is a fraction of when an engine sizes a simulated GPU's KV cache (harness/kv/budget.py).
KV_FRACTION_OF = ("total", "free")


def _resolve_engine(cfg: Config) -> None:
    """Fill the engine's figures from conf/engine/NAME.yaml (a key already set wins; gpu=NAME and no engine:
    vllm_v1) and check them; ``chunked_prefill`` and ``max_num_batched_tokens`` left null take the engine's
    defaults in a bookkeeping scenario (the roofline prices its steps), false and DEFAULT_TOKEN_BUDGET elsewhere.
    No gpu=NAME: no engine, the CPU paths as they were."""
    if cfg.engine is None and cfg.gpu is not None:
        cfg.engine = EngineConfig(name=DEFAULT_ENGINE)
    engine = cfg.engine
    if engine is None:
        cfg.chunked_prefill = bool(cfg.chunked_prefill)
        if cfg.max_num_batched_tokens is None:
            cfg.max_num_batched_tokens = DEFAULT_TOKEN_BUDGET
        return
    check(cfg.gpu is not None, f"engine={engine.name} prices the simulated clock's steps on a GPU's roofline: it "
                               "needs gpu=NAME (conf/gpu/)")
    one_of("engine.name", engine.name, choices("engine"))
    spec_file = load_group("engine", engine.name, EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        if getattr(engine, f.name) is None:
            setattr(engine, f.name, getattr(spec_file, f.name))
    engine_spec(engine, is_offline(cfg))  # a figure out of range is a ConfigError naming its key and range
    if engine.kv_fraction_of is not None:
        one_of("engine.kv_fraction_of", engine.kv_fraction_of, KV_FRACTION_OF)
    if cfg.chunked_prefill is None:
        cfg.chunked_prefill = bool(engine.chunked_prefill) and cfg.scenario.bookkeeping
    if cfg.max_num_batched_tokens is None:
        tiers = engine.token_budget if cfg.scenario.bookkeeping else None
        cfg.max_num_batched_tokens = (token_budget(tiers, cfg.gpu.name, cfg.gpu.memory_mib, is_offline(cfg))
                                      if tiers else DEFAULT_TOKEN_BUDGET)  # the card's memory: its file's, or set


def _fill_gpu(gpu: GpuConfig) -> None:
    """The figures of conf/gpu/NAME.yaml that ``gpu`` leaves unset (a key already set wins)."""
    one_of("gpu.name", gpu.name, choices("gpu"))
    unset = [key for key in GpuSpec.field_names() if getattr(gpu, key) is None]
    if unset:  # every figure given on the command line: no file to read
        spec_file = load_group("gpu", gpu.name, GpuConfig)
        for key in unset:
            setattr(gpu, key, getattr(spec_file, key))


def _resolve_gpu(cfg: Config) -> None:
    """Check the chosen GPU's figures (``_fill_gpu`` took them from conf/gpu/NAME.yaml, a key already set winning).

    In a bookkeeping scenario the GPUs' total memory (``memory_mib``, in bytes, x count) is the default
    ``device.memory_gb`` (decimal GB: bytes / 1e9), and it must at least hold the weights.
    """
    gpu = cfg.gpu
    spec = gpu_spec(gpu)  # a figure <= 0 is a ConfigError naming its key
    if not _simulated_gpu(cfg) or cfg.device.memory_gb is not None:
        return
    cfg.device.memory_gb = spec.memory_bytes * spec.count / GB
    usable = cfg.device.memory_gb * cfg.device.utilization
    weights = stored_weight_bytes(cfg.model, cfg.dtype, cfg.weight_dtype) / GB
    check(weights < usable,
          f"gpu={gpu.name} x gpu.count={spec.count}: {usable:.1f} GB usable ({cfg.device.memory_gb:g} GB x "
          f"device.utilization={cfg.device.utilization}) cannot hold the weights of model={cfg.model.name} "
          f"({weights:.1f} GB, dtype={cfg.dtype}); raise gpu.count")

