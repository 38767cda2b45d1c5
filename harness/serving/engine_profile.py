"""Engine profiles: what a serving engine adds to the GPU's work on the simulated clock (conf/engine/NAME.yaml).

The roofline (harness/serving/cost_model.py) prices what the GPU does in a step. A serving engine adds host
work around it, and how that work lines up with the GPU's is the engine's, not the card's (issue 46: vLLM's V0
engine shows about 2.6 ms of fixed cost a step on an A100, its V1 engine about 1.0 ms, on the same card):

    o     fixed host cost of a step (scheduling, input preparation, output processing), s  ``step_overhead_us``
    c     host cost of each sequence in a step (its block table, its sampling and stop checks), s  ``seq_overhead_us``
    lo    device cost of each layer of a step (kernel launches and tails the engine's graphs leave), s
    p     the knee of the engine's matmuls (``gemm_knee``): w seconds of weight read and c of FLOPs take
          (w^p + c^p)^(1/p); null: max(w, c). The GEMM kernels are the engine's choice, so the knee is too.
    n0    the routed experts' grouped GEMMs (vLLM's and SGLang's Triton fused_moe) run at em = N / (N + n0) of a
          dense GEMM's rate of the same work, N an expert's intermediate size on one GPU (``moe_gemm_half_n``;
          null: em = 1): the down projection reduces over N, and a short reduction keeps the tiles' pipelines
          filling and draining (harness/serving/cost_model.py, version 10)
    k     steps one scheduling pass runs (V0's ``--num-scheduler-steps``): a decode step's host cost is 1/k of it
    fe    a request's front-end cost (HTTP server, tokenize, detokenize, stream), s: added to its TTFT and E2EL
          (not to TPOT: every later token pays it in parallel with the engine), zero for an offline run

    host(S)        = (o + c*S) / k       S sequences in the step (k = 1 for a step that computes prompts)
    step(S, dev)   = host(S) + dev       synchronous: the GPU waits for the host, then the host for the GPU
                   = max(host(S), dev)   async scheduling (vLLM V1's ``--async-scheduling``, SGLang's overlap
                                         scheduler, TensorRT-LLM's): the next step's host work runs under this
                                         step's GPU work, so the slower of the two sets the pace

``dev`` is the roofline's step, ``L*lo`` included. A run is offline when ``engine.offline`` says so, or, left
null, when every request is there at t=0 (``arrival=burst``: an offline batch, as ``vllm bench throughput`` and
``LLM.generate`` run it, with no server in front).
Plain numbers only (no torch): the clock prices millions of steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Callable

from kvbench.harness.errors import ConfigError

DEFAULT_ENGINE = "vllm_v1"
# Upper bounds that catch a unit slip (ms written as us, s as ms) while leaving room for slow hosts.
TIME_LIMITS = {"step_overhead_us": 100_000.0, "seq_overhead_us": 10_000.0, "layer_overhead_us": 10_000.0,
                "frontend_ms": 10_000.0}
MAX_SCHEDULER_STEPS = 256


@dataclass(frozen=True)
class EngineSpec:
    """One engine's host costs and scheduling mode; the defaults are neutral (no host cost, synchronous), for
    hand-built clocks."""

    name: str = "none"
    step_overhead_us: float = 0.0  # o
    seq_overhead_us: float = 0.0  # c
    layer_overhead_us: float = 0.0  # lo
    frontend_ms: float = 0.0  # fe, before ``offline`` is applied
    gemm_knee: float | None = None  # p; None: max(read, FLOPs), a sharp roofline
    moe_gemm_half_n: float | None = None  # n0; None: the routed experts at a dense GEMM's rate
    async_scheduling: bool = False
    scheduler_steps: int = 1  # k
    offline: bool = True  # no front-end: fe does not apply

    def __post_init__(self) -> None:
        for key, top in TIME_LIMITS.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= top:
                raise ConfigError(f"engine.{key}={value} must be a number in [0, {top:g}] (engine={self.name})")
        p = self.gemm_knee
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 1 <= p < math.inf):
            raise ConfigError(f"engine.gemm_knee={p} must be a finite number >= 1 (1: read and FLOPs add up; larger: "
                              f"a sharper knee), or null in conf/engine/ for max(read, FLOPs) (engine={self.name})")
        n0 = self.moe_gemm_half_n
        if n0 is not None and (isinstance(n0, bool) or not isinstance(n0, (int, float)) or not 0 < n0 < math.inf):
            raise ConfigError(f"engine.moe_gemm_half_n={n0} must be a finite number > 0 (the expert width at which "
                              f"the routed experts' GEMMs reach half a dense GEMM's rate), or null in conf/engine/ "
                              f"for the dense rate (engine={self.name})")
        k = self.scheduler_steps
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SCHEDULER_STEPS:
            raise ConfigError(f"engine.scheduler_steps={k} must be an integer in [1, {MAX_SCHEDULER_STEPS}] "
                              f"(1: a scheduling pass a step; V0's --num-scheduler-steps) (engine={self.name})")
        for key in ("async_scheduling", "offline"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"engine.{key}={getattr(self, key)} must be true or false (engine={self.name})")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @property
    def frontend_s(self) -> float:
        """fe: what each request's TTFT and E2EL gain; zero offline."""
        return 0.0 if self.offline else self.frontend_ms * 1e-3

    def matmul_s(self, read_s: float, compute_s: float) -> float:
        """A step's matmuls of ``read_s`` seconds of weight read and ``compute_s`` of FLOPs: (w^p + c^p)^(1/p)."""
        p = self.gemm_knee
        if p is None or not read_s or not compute_s:
            return max(read_s, compute_s)
        big = max(read_s, compute_s)  # scaled, so that w^p stays finite for any p
        return big * ((read_s / big) ** p + (compute_s / big) ** p) ** (1 / p)

    def expert_rate(self, width: float) -> float:
        """em: the routed experts' GEMMs' rate over a dense GEMM's, for experts ``width`` wide on one GPU."""
        n0 = self.moe_gemm_half_n
        return 1.0 if n0 is None or width <= 0 else width / (width + n0)

    def layers_s(self, layers: int) -> float:
        """L*lo: device time of a step's per-layer costs."""
        return layers * self.layer_overhead_us * 1e-6

    def host_s(self, seqs: int, decode: bool = True) -> float:
        """host(S): a decode step's share of its scheduling pass (1/k), or a prompt step's whole one."""
        host = (self.step_overhead_us + self.seq_overhead_us * seqs) * 1e-6
        return host / self.scheduler_steps if decode else host

    def step_s(self, host: float, device: float) -> float:
        """A step of ``host`` seconds of host work and ``device`` seconds of GPU work."""
        return max(host, device) if self.async_scheduling else host + device

    def host_bound_steps(self, host: float, device_at: Callable[[int], float], steps: int) -> int:
        """Of ``steps`` decode steps whose device time ``device_at(j)`` (j = 0..steps-1) does not fall with j, how
        many are shorter than ``host``: async scheduling prices those at the host's time (in series: none)."""
        if not self.async_scheduling:
            return 0
        lo, hi = 0, steps  # the first step whose device time reaches the host's (a jump prices thousands at once)
        while lo < hi:
            mid = (lo + hi) // 2
            if device_at(mid) >= host:
                hi = mid
            else:
                lo = mid + 1
        return lo


def engine_spec(engine, offline: bool) -> EngineSpec:
    """A resolved ``EngineConfig`` (harness/config.py: every figure filled) as a validated spec; ``offline``:
    the run's (``engine.offline``, or derived from its arrivals)."""
    figures = {key: getattr(engine, key) for key in EngineSpec.field_names() if key != "offline"}
    nullable = ("gemm_knee", "moe_gemm_half_n")  # null: a sharp knee; the experts at a dense GEMM's rate
    unset = [key for key, value in figures.items() if value is None and key not in nullable]
    if unset:
        raise ConfigError(f"engine={engine.name}: {', '.join(f'engine.{k}' for k in unset)} not set; "
                          f"conf/engine/{engine.name}.yaml (or the command line) must give each")
    return EngineSpec(**figures, offline=offline)


def is_offline(cfg) -> bool:
    """``engine.offline``, or, left null, whether every request arrives at t=0 (``arrival=burst``)."""
    chosen = cfg.engine.offline if cfg.engine is not None else None
    return cfg.arrival.name == "burst" if chosen is None else chosen


def token_budget(tiers, gpu_name: str, memory_mib: float, offline: bool) -> int:
    """The engine's default ``max_num_batched_tokens`` on a card of ``memory_mib`` named ``gpu_name`` (conf/gpu/):
    the first of ``tiers`` (EngineConfig.token_budget, in the file's order) the card meets, its ``offline`` or
    ``online`` figure. vLLM V1 and SGLang pick theirs at start-up from the card's memory, as these tiers do."""
    for tier in tiers:
        for key in ("online", "offline"):
            value = getattr(tier, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"engine.token_budget: a tier's {key}={value} must be an integer >= 1")
        if tier.min_memory_gib < 0:
            raise ConfigError(f"engine.token_budget: min_memory_gib={tier.min_memory_gib} must be >= 0")
        excluded = any(name.lower() in gpu_name.lower() for name in tier.except_gpus)
        if memory_mib / 1024 >= tier.min_memory_gib and not excluded:
            return tier.offline if offline else tier.online
    raise ConfigError(f"engine.token_budget: no tier applies to gpu={gpu_name} ({memory_mib / 1024:.1f} GiB); "
                      "the last tier should have min_memory_gib: 0 and no except_gpus")
