"""How much memory the KV cache may take, as vLLM sizes it, and the bounds on it: the budget's one home.

GPU: (total memory x utilization, or the ``device.memory_gb`` cap) minus the
weights, the CUDA graphs' pool and the activation peak, measured once over the
largest forward the engine runs (vLLM's profile run: ``measured_kv_budget``). CPU and
the capacity scenario: the simulated device ``device.memory_gb`` x utilization minus
the weights and an activation estimate (``kv_budget``).

Every memory value is finite and at most the device it describes: the GPU's memory
when a run allocates on the GPU, else ``MAX_SIMULATED_GB``. On CPU the decode
scenario really allocates its KV pool in RAM, so the pool may take at most
``HOST_POOL_RAM_FRACTION`` of the free RAM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from kvbench.harness.config import Config
from kvbench.harness.errors import ConfigError
from kvbench.harness.kv.sizes import GB, activation_bytes_estimate, stored_weight_bytes, weight_bytes

# The largest simulated device (CPU runs, the capacity scenario): a node of 8 GPUs of 256 GB.
MAX_SIMULATED_GB = 2048.0
# On CPU the KV pool is allocated in RAM: at most this share of the RAM free when it is built.
HOST_POOL_RAM_FRACTION = 0.5
HOST_WEIGHTS_RAM_FRACTION = 0.8  # of the free RAM, for the model's weights on CPU


@dataclass(frozen=True)
class MemoryBudget:
    device_bytes: int  # the device, or the simulated / capped size
    usable_bytes: int  # device_bytes x utilization
    weight_bytes: int
    activation_bytes: int
    kv_bytes: int  # what is left for the KV cache
    source: str  # where device_bytes came from
    graph_bytes: int = 0  # held by the decode CUDA graphs (cuda_graph=true), charged before the KV cache

    def as_row(self) -> dict[str, int | str]:
        return {f"budget_{k}": v for k, v in asdict(self).items()}


def forward_tokens_bound(cfg: Config, prompt_lens: Sequence[int] | None = None) -> int:
    """Tokens of the largest single forward the engine runs (what vLLM profiles).

    A prefill step computes at most ``max_num_batched_tokens`` tokens, or one prompt that
    is longer (admitted alone); a decode step one token per running sequence. With the
    workload's prompt lengths known the bound is tighter: no step computes more prompt
    tokens than the workload has.
    """
    decode = cfg.batch * cfg.workload.n
    if not prompt_lens:
        return max(cfg.max_num_batched_tokens, cfg.max_seq_len, decode)
    return max(min(cfg.max_num_batched_tokens, sum(prompt_lens)), max(prompt_lens), decode)


def logits_rows_bound(cfg: Config) -> int:
    """Logits rows one forward keeps: one per running sequence (decode) or admitted one (prefill)."""
    return cfg.batch * cfg.workload.n


def kv_fraction_of(cfg: Config) -> str:
    """What ``device.utilization`` is a fraction of: the engine's ``kv_fraction_of`` ("total" without an engine:
    vLLM's rule, and every CPU run's)."""
    engine = getattr(cfg, "engine", None)
    return (engine.kv_fraction_of if engine is not None else None) or "total"


def kv_budget(
    cfg: Config,
    device_total_bytes: int | None = None,
    measured_weight_bytes: int | None = None,
    measured_activation_bytes: int | None = None,
    prompt_lens: Sequence[int] | None = None,
    graph_bytes: int = 0,
) -> MemoryBudget:
    if cfg.device.memory_gb is not None:
        device_bytes = int(cfg.device.memory_gb * GB)
        source = "device.memory_gb"
        if device_total_bytes is not None and device_bytes > device_total_bytes:
            raise ConfigError(f"device.memory_gb={cfg.device.memory_gb:g} is larger than the GPU "
                              f"({device_total_bytes / GB:.2f} GB); at most {device_total_bytes / GB:.2f}")
    elif device_total_bytes is not None:
        device_bytes, source = device_total_bytes, "device total"
    else:
        raise ConfigError("device.memory_gb must be set when the device size cannot be read")
    usable = int(device_bytes * cfg.device.utilization)
    # A simulated GPU's weights as stored (weight_dtype=fp8: the decoder layers a byte a value).
    weights = (measured_weight_bytes if measured_weight_bytes is not None
               else stored_weight_bytes(cfg.model, cfg.dtype, getattr(cfg, "weight_dtype", "auto")))
    act = (measured_activation_bytes if measured_activation_bytes is not None
           else activation_bytes_estimate(cfg.model, cfg.dtype, forward_tokens_bound(cfg, prompt_lens),
                                          logits_rows_bound(cfg)))
    rule = kv_fraction_of(cfg)
    if rule == "free":  # TensorRT-LLM: utilization x what the weights and activations leave
        kv = int((device_bytes - weights - act - graph_bytes) * cfg.device.utilization)
        usable = weights + act + graph_bytes + max(kv, 0)
    else:  # vLLM: utilization x the card, less the weights and activations
        kv = usable - weights - act - graph_bytes
    if cfg.device.kv_cache_gb is not None:
        if cfg.device.kv_cache_gb * GB > device_bytes:
            raise ConfigError(f"device.kv_cache_gb={cfg.device.kv_cache_gb:g} is larger than the device "
                              f"({device_bytes / GB:.3g} GB, from {source}); lower device.kv_cache_gb"
                              + (" or raise device.memory_gb" if source == "device.memory_gb" else ""))
        return MemoryBudget(device_bytes, usable, weights, act, int(cfg.device.kv_cache_gb * GB), "device.kv_cache_gb",
                            graph_bytes)
    if kv <= 0:
        gpu = f"gpu={cfg.gpu.name} x gpu.count={cfg.gpu.count}: " if cfg.gpu is not None else ""
        share = (f"device.memory_gb={device_bytes / GB:.2f} GB x device.utilization={cfg.device.utilization} "
                 f"= {usable / GB:.2f} GB" if rule == "total" else
                 f"device.memory_gb={device_bytes / GB:.2f} GB (engine.kv_fraction_of=free: the KV cache gets "
                 f"device.utilization x what the rest leaves)")
        raise ConfigError(
            f"{gpu}{share} leaves nothing for the KV cache: weights need {weights / GB:.2f} GB "
            f"and activations {act / GB:.2f} GB"
            + (f" and CUDA graphs {graph_bytes / GB:.2f} GB" if graph_bytes else "")
            + f" (model={cfg.model.name}, dtype={cfg.dtype})"
        )
    return MemoryBudget(device_bytes, usable, weights, act, kv, source, graph_bytes)


def measure_activation_peak(model, device, head_dim: int, num_tokens: int, logits_rows: int) -> int | None:
    """GPU: the allocator peak of one forward of ``model`` over ``num_tokens`` tokens keeping
    ``logits_rows`` rows of logits, the largest forward the engine runs (vLLM's profile run)."""
    if device.type != "cuda":
        return None
    import torch

    from kvbench.kernels.prefill import prefill_attention

    scale = head_dim**-0.5
    ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
    pos = torch.arange(num_tokens, device=device)
    at = torch.arange(max(0, num_tokens - logits_rows), num_tokens, device=device)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        model(ids, pos, lambda layer, q, k, v: prefill_attention(q, k, v, scale), at)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def measured_kv_budget(cfg: Config, device, prompt_lens: Sequence[int], build_model, build_pieces) -> MemoryBudget:
    """The KV budget of a run with a real model on ``device``: measured on a GPU, estimated elsewhere.

    ``build_model()`` and ``build_pieces()`` (the decode CUDA graphs, or None) are called only
    once the analytic budget leaves room for the weights, so a budget that leaves nothing fails
    before any weight is built. The graphs are captured first, as vLLM does: their memory is
    held for the whole run, so the KV cache gets none of it.
    """
    total = None
    if device.type == "cuda":
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
    else:
        kv_budget(cfg, None, None, None, prompt_lens)
    pieces = build_pieces()
    model = build_model()
    act = measure_activation_peak(model, device, cfg.model.head_dim, forward_tokens_bound(cfg, prompt_lens),
                                  logits_rows_bound(cfg))
    return kv_budget(cfg, total, model.num_parameter_bytes(), act, prompt_lens,
                     pieces.pool_bytes if pieces is not None else 0)


def simulated(cfg: Config) -> bool:
    """The run only does bookkeeping against its budget: nothing of that size is allocated."""
    return cfg.scenario.bookkeeping


def _memory_values(cfg: Config) -> list[tuple[str, float]]:
    return [(key, value) for key, value in (("device.memory_gb", cfg.device.memory_gb),
                                            ("device.kv_cache_gb", cfg.device.kv_cache_gb)) if value is not None]


def check_memory_values(cfg: Config) -> None:
    """``device.memory_gb`` and ``device.kv_cache_gb``: finite and > 0 (what needs no device)."""
    for key, value in _memory_values(cfg):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{key}={value} must be a finite number of GB > 0")


def check_memory_bounds(cfg: Config, gpu_total_bytes: int | None) -> None:
    """``device.memory_gb`` and ``device.kv_cache_gb``: finite, > 0, at most the device they describe.

    The device is the GPU (``gpu_total_bytes``) when the run allocates on it, else a
    simulated one of at most ``MAX_SIMULATED_GB``.
    """
    check_memory_values(cfg)
    if gpu_total_bytes is not None and not simulated(cfg):
        bound, what = gpu_total_bytes / GB, "the GPU's memory"
    else:
        bound, what = MAX_SIMULATED_GB, "the largest simulated device"
    for key, value in _memory_values(cfg):
        if value > bound:
            raise ConfigError(f"{key}={value:g} is larger than {what}; at most {bound:.6g} GB")


def check_host_pool(kv_bytes: int, free_ram_bytes: int) -> None:
    """A KV pool of ``kv_bytes`` in RAM (CPU): refused above ``HOST_POOL_RAM_FRACTION`` of the free RAM."""
    limit = int(free_ram_bytes * HOST_POOL_RAM_FRACTION)
    if kv_bytes > limit:
        raise ConfigError(
            f"a KV pool of {kv_bytes / GB:.2f} GB is allocated in RAM on CPU and may take at most "
            f"{HOST_POOL_RAM_FRACTION:.0%} of the free RAM ({limit / GB:.2f} of {free_ram_bytes / GB:.2f} GB); "
            "lower device.memory_gb or set a smaller device.kv_cache_gb")


def check_host_weights(cfg: Config, free_ram_bytes: int) -> None:
    """The model's weights, built in RAM on CPU: refused above ``HOST_WEIGHTS_RAM_FRACTION`` of the
    free RAM, with the sizes, instead of the kernel's OOM killer ending the process with no row."""
    weights = weight_bytes(cfg.model, cfg.dtype)
    limit = int(free_ram_bytes * HOST_WEIGHTS_RAM_FRACTION)
    if weights > limit:
        raise ConfigError(
            f"model={cfg.model.name} in dtype={cfg.dtype} needs {weights / GB:.2f} GB of weights in RAM on CPU, "
            f"more than {HOST_WEIGHTS_RAM_FRACTION:.0%} of the free RAM ({limit / GB:.2f} of "
            f"{free_ram_bytes / GB:.2f} GB); use a smaller model (tiny-llama, qwen2.5-0.5b, llama-3.2-1b) or "
            "scenario=capacity, which allocates nothing")


# Host memory of the drawn workload, per request and per token (prompt ids, outputs, the scheduler's
# and the simulator's state): measured 100,000 chat requests of 512 + 256 tokens at about 9 KB each
# (1.2 GB for the whole capacity process), so this overestimates by about 1.5x, as a guard should.
HOST_BYTES_PER_REQUEST = 2048
HOST_BYTES_PER_TOKEN = 16
# Below this a workload cannot take a machine down, whatever the free RAM reads: never refused.
HOST_CHECK_MIN_BYTES = 256 * 2**20


def workload_host_bytes(cfg: Config) -> int:
    """Host RAM the drawn workload takes (its requests, and capacity's largest concurrency point)."""
    w = cfg.workload
    requests = max([w.num_requests or cfg.batch, *getattr(cfg.scenario, "concurrency_points", [])])
    tokens = math.ceil(w.prompt_len) + w.n * math.ceil(w.output_len)
    return requests * (HOST_BYTES_PER_REQUEST + HOST_BYTES_PER_TOKEN * tokens)


def check_host_workload(cfg: Config, free_ram_bytes: int) -> None:
    """Refuse, with the sizes, a workload that would pass ``HOST_WEIGHTS_RAM_FRACTION`` of the free RAM, before
    it is drawn: on a shared machine the OOM killer could end the run with no row, or someone else's process.
    The weights (``check_host_weights``) and the KV pool (``check_host_pool``) are checked before they are built."""
    need = workload_host_bytes(cfg)
    limit = int(free_ram_bytes * HOST_WEIGHTS_RAM_FRACTION)
    if need <= max(limit, HOST_CHECK_MIN_BYTES):
        return
    w = cfg.workload
    raise ConfigError(f"the workload needs about {need / GB:.2f} GB of host memory ({w.num_requests or cfg.batch} "
                      f"requests of about {w.prompt_len:g} + {w.output_len:g} tokens), more than "
                      f"{HOST_WEIGHTS_RAM_FRACTION:.0%} of the free RAM ({limit / GB:.2f} of {free_ram_bytes / GB:.2f} GB); "
                      "lower workload.num_requests (its default is batch)")


def out_of_memory_message(exc: BaseException) -> str | None:
    """The ``status=oom`` message for an allocation failure (torch's, Python's or the CPU allocator's), else None."""
    import torch

    text = str(exc).strip()
    if isinstance(exc, MemoryError):  # Python's own: usually with no text at all
        return f"MemoryError: out of host memory{': ' + text if text else ''} (lower the budget or the workload)"
    if isinstance(exc, torch.OutOfMemoryError) or any(
            s in text.lower() for s in ("out of memory", "can't allocate memory", "cannot allocate memory")):
        return f"{type(exc).__name__}: {text}"
    return None


def raise_budget_advice(cfg: Config) -> str:
    """Which key makes the KV pool larger: the one that sized it."""
    if cfg.device.kv_cache_gb is not None:
        return "raise device.kv_cache_gb"
    if cfg.device.memory_gb is not None:
        return "raise device.memory_gb (or set device.kv_cache_gb)"
    return "raise device.utilization (or set device.kv_cache_gb)"


def budget_limit_note(cfg: Config, memory_bound_steps: int, decode_steps: int, peak_running: int,
                      preemptions: int) -> str | None:
    """A decode row's note when the KV budget, not ``batch``, capped concurrency; None otherwise.

    The engine counts the decode steps in which an arrived request waited while the batch
    had room for it (``memory_bound_steps``): only memory kept the scheduler from admitting
    it. A preemption says the same. Arrival-aware: a request not yet arrived never counts.
    """
    if not memory_bound_steps and not preemptions:
        return None
    allowed = cfg.batch * cfg.workload.n  # sequences: parallel samples count one each
    why = (f"at most {peak_running} of the {allowed} sequences batch={cfg.batch} allows ran at once while others "
           f"waited ({memory_bound_steps} of {decode_steps} decode steps)")
    if preemptions:
        why += f", with {preemptions} preemptions"
    return f"the KV budget, not batch, limited concurrency: {why}; {raise_budget_advice(cfg)} for a larger pool"
