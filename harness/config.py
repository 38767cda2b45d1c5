"""The structured config schema: one dataclass per config group.

Hydra merges conf/*.yaml over these dataclasses (type-checking every key);
``harness.front.resolve`` then fills the ``auto`` choices and validates the values once,
at the entry point, raising ``ConfigError`` naming the bad key and the allowed values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING, OmegaConf

from kvbench.harness.model.config import ModelConfig

DTYPES = ("float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
PROBES = ("decode", "capacity")
DISTRIBUTIONS = ("fixed", "uniform", "lognormal", "trace", "text")
ARRIVALS = ("burst", "poisson", "gamma", "constant", "trace")
RATE_ARRIVALS = ("poisson", "gamma", "constant")  # the processes that need arrival.rate
TRACE_SAMPLES = ("head", "random")
WORKLOAD_KINDS = ("plain", "multi_turn", "system_prompt")  # how prompts share tokens (harness/serving/workload.py)
THINK_DISTRIBUTIONS = ("exponential", "fixed")  # kind=multi_turn: a user's think time between turns
TRACE_FORMATS = ("plain", "mooncake")  # mooncake: hash_ids of prompt blocks, timestamps in ms (trace.py)
MAX_BLOCK_SIZE = 128
ISOLATIONS = ("auto", "none", "process")


@dataclass
class ImplConfig:
    """A KV-cache implementation: a cache layout plus a decode-attention kernel."""

    name: str = MISSING
    cache: str = "paged"  # contiguous | paged
    kernel: str = "torch"  # sdpa (contiguous only) | torch | triton | cuda
    # Share full blocks across requests by content hash (paged only).
    prefix_caching: bool = True
    # Which cached free block is evicted first (paged with prefix caching; impls/eviction.py):
    # lru (least recently freed, vLLM's) | lfu (fewest hits, aged) | 2q (scan resistant)
    eviction: str = "lru"
    # Slots a sequence reserves at admission (contiguous only; impls/reservation.py):
    # max (max_seq_len, Orca (Max)) | pow2 (next power of two of prompt + output) | oracle (exactly that)
    reservation: str = "max"


@dataclass
class TraceColumns:
    """The columns of a trace file that hold each request's lengths and arrival time."""

    prompt_len: str = "prompt_len"
    output_len: str = "output_len"
    arrival_s: str = "arrival_s"  # optional in the file; needed by arrival=trace
    hash_ids: str = "hash_ids"  # format=mooncake: each prompt block's hash id (a list per row)


@dataclass
class WorkloadConfig:
    name: str = "chat"
    distribution: str = "lognormal"  # fixed | uniform | lognormal | trace (lengths from workload.path)
    num_requests: Optional[int] = None  # None: equal to the top-level batch (workload=trace: every row of the file)
    # Means, in tokens. Floats so a dataset's measured mean (sharegpt: 161.31) is written as is;
    # whole numbers draw exactly the requests they drew when these were ints.
    prompt_len: float = 96
    output_len: float = 64
    # uniform: lengths in [mean * (1 - spread), mean * (1 + spread)]
    spread: float = 0.5
    # uniform: the output lengths' own spread where it differs from the prompts' (None: ``spread``). A benchmark run
    # without --ignore-eos has fixed prompts and outputs that stop at EOS or max_tokens: spread 0, output_spread > 0.
    output_spread: Optional[float] = None
    # lognormal: sigma of log(length); the mean of the distribution stays `*_len`
    sigma: float = 0.6
    shared_prefix_len: int = 0  # tokens common to every prompt (a system prompt)
    n: int = 1  # parallel samples per prompt
    vocab_limit: Optional[int] = None  # draw ids below this (default: model vocab)
    # distribution=trace: a CSV, JSONL or parquet file, one request per row (harness/serving/trace.py);
    # distribution=text: a local UTF-8 text, cut into windows of prompt_len + output_len tokens by the
    # checkpoint's tokenizer (model.path; harness/serving/text_workload.py)
    path: Optional[str] = None
    columns: TraceColumns = field(default_factory=TraceColumns)
    sample: str = "head"  # head (the first rows) | random (seeded, without replacement)
    # distribution=trace, format=mooncake: token ids drawn from each row's hash_ids, one id per
    # hash_block_size tokens, so equal ids give equal tokens (prefix reuse); timestamps in ms.
    format: str = "plain"  # plain | mooncake
    hash_block_size: int = 512
    # How prompts share tokens: plain (independent prompts after shared_prefix_len common tokens) |
    # multi_turn (users x turns; a turn's prompt is its user's whole history plus a new message of
    # prompt_len tokens; closed-loop arrivals, harness/serving/conversations.py) | system_prompt
    # (system_prompts distinct prompts of system_prompt_len tokens, Zipf-popular, before a user part).
    kind: str = "plain"
    users: int = 8
    turns: int = 4
    think_time_s: float = 1.0  # mean seconds from a user's answer to that user's next turn
    think_distribution: str = "exponential"  # exponential | fixed
    system_prompts: int = 8
    system_prompt_len: int = 256
    zipf_exponent: float = 1.0  # system prompt i (from 1) is chosen with weight i ** -zipf_exponent


@dataclass
class ArrivalConfig:
    """When each request arrives (harness/serving/arrivals.py); burst is every request at t=0."""

    name: str = "burst"  # burst | poisson | gamma | constant | trace
    rate: Optional[float] = None  # offered requests per second (poisson, gamma, constant)
    burstiness: float = 1.0  # gamma shape; 1 is Poisson, smaller is burstier
    time_scale: float = 1.0  # trace: multiply the file's arrival times
    # A client's cap on requests in flight (vllm bench serve --max-concurrency): a request is sent when one of the C
    # before it has come back whole, and no earlier than its arrival (harness/serving/client_cap.py). None: no cap.
    max_concurrency: Optional[int] = None


@dataclass
class SloConfig:
    """Service-level objectives; each limit is optional (None: not checked)."""

    name: str = "none"
    ttft_ms: Optional[float] = None
    tpot_ms: Optional[float] = None
    e2el_ms: Optional[float] = None
    percentile: float = 99  # the percentile of TTFT, TPOT and E2EL held to the limits
    # A bound on the mean normalized latency (E2E latency / output tokens): the paper's criterion.
    normalized_latency_s: Optional[float] = None


@dataclass
class DeviceConfig:
    name: str = "auto"  # auto | cpu | cuda
    # A memory budget in GB (1e9 bytes): the simulated device on CPU, an optional cap on GPU; with gpu=NAME in a
    # bookkeeping scenario it defaults to the GPUs' memory (conf/gpu/NAME.yaml memory_mib x count, in bytes / 1e9).
    memory_gb: Optional[float] = None
    utilization: float = 0.9
    # Fix the KV cache size in GB instead of deriving it (like vLLM's kv_cache_memory_bytes).
    kv_cache_gb: Optional[float] = None
    # Free blocks kept back when admitting (vLLM's watermark), as a fraction of the pool.
    watermark: float = 0.01
    # A host-memory tier under the prefix cache, GB (paged with prefix caching; impls/host_tier.py):
    # evicted blocks go there and a hit copies them back. None or 0: no tier.
    host_kv_gb: Optional[float] = None


@dataclass
class GpuConfig:
    """A GPU for the simulated clock (conf/gpu/NAME.yaml; harness/serving/cost_model.py uses the figures).

    ``gpu=NAME`` fills every figure from the file; any can be overridden, e.g. a copy bandwidth
    measured on your GPU as ``copy_bandwidth_gbps``. A figure left None is taken from conf/gpu/NAME.yaml.
    """

    name: str = MISSING
    # The words of this GPU's name as torch and NVML give it ("NVIDIA H100 80GB HBM3": h100): the
    # report finds a measured row's peak bandwidth here (harness/report/hardware.py). A label, not a figure.
    match: List[str] = field(default_factory=list)
    count: int = 1  # GPUs working on one model (tensor parallel)
    # Per GPU, MiB (2**20 bytes): the total the driver reports (nvidia-smi's "Memory-Usage" total). The capacity
    # scenario's device.memory_gb (decimal GB) defaults to its bytes x count / 1e9.
    memory_mib: Optional[float] = None
    bandwidth_gbps: Optional[float] = None  # memory bandwidth per GPU, GB/s
    tflops: Optional[float] = None  # dense bf16/fp16 tensor peak per GPU, TFLOP/s
    # Dense fp8 tensor peak per GPU, TFLOP/s: what weight_dtype=fp8 computes at (W8A8); null: no fp8 tensor cores
    # (A100), fp8 weights are read as 1 byte and computed at ``tflops`` (weight-only, as vLLM's Marlin kernel runs them).
    fp8_tflops: Optional[float] = None
    bw_efficiency: Optional[float] = None
    flops_efficiency: Optional[float] = None
    # Roofline version 9: the matmuls' efficiency by a step's work, from flops_efficiency_small (a small step) to
    # flops_efficiency (a large one), half-way at flops_ramp_gflop (a layer's GFLOP on one GPU); both null:
    # flops_efficiency at every size.
    flops_efficiency_small: Optional[float] = None
    flops_ramp_gflop: Optional[float] = None
    fp8_flops_efficiency: Optional[float] = None  # at fp8_tflops (W8A8), every size; null: flops_efficiency
    interconnect_gbps: Optional[float] = None  # per GPU and direction, GB/s
    interconnect_latency_us: Optional[float] = None
    # Roofline version 11: [[count, latency_us, busbw_gbps], ...], the all-reduce measured on that many GPUs (NCCL at
    # a decode's message sizes); a count not listed takes interconnect_latency_us and interconnect_gbps.
    allreduce_by_count: Optional[List[Any]] = None  # rows of three numbers (OmegaConf types no nested list of floats)
    # Roofline version 2 and later (harness/serving/cost_model.py): a measured copy bandwidth (null: none known),
    # decode attention's fraction of it. (A step's and a layer's fixed costs, and the matmuls' knee, are the
    # engine's since versions 6 and 8: EngineConfig.)
    copy_bandwidth_gbps: Optional[float] = None  # measured device-to-device copy, read + write, GB/s
    attn_bw_efficiency: Optional[float] = None
    # The host link (a host tier, swap): bandwidth per direction, GB/s, and each transfer's fixed cost.
    host_link_gbps: Optional[float] = None
    host_link_latency_us: Optional[float] = None


# max_num_batched_tokens left null with no engine tier to take (no gpu=NAME, a scenario that computes, an engine file
# without token_budget): kvbench's budget since its first release.
DEFAULT_TOKEN_BUDGET = 8192


@dataclass
class TokenBudgetTier:
    """One tier of an engine's default token budget (``max_num_batched_tokens``) by card, as the engines pick it at
    start-up from the GPU they find: it applies to a card of at least ``min_memory_gib`` whose conf/gpu/ name holds
    none of ``except_gpus``; ``online`` for a served run, ``offline`` for an offline batch (engine_profile.is_offline)."""

    min_memory_gib: float = 0.0
    except_gpus: List[str] = field(default_factory=list)
    online: int = MISSING
    offline: int = MISSING


@dataclass
class EngineConfig:
    """A serving engine's host costs and scheduling mode for the simulated clock (conf/engine/NAME.yaml;
    harness/serving/engine_profile.py). ``engine=NAME`` fills every figure left None from the file; with
    ``gpu=NAME`` and no engine, vllm_v1's. Only the roofline reads it."""

    name: str = MISSING
    step_overhead_us: Optional[float] = None  # host: fixed cost of a step
    seq_overhead_us: Optional[float] = None  # host: cost of each sequence in a step
    layer_overhead_us: Optional[float] = None  # device: cost of each layer of a step
    frontend_ms: Optional[float] = None  # a request's server, tokenize and detokenize cost: TTFT and E2EL
    gemm_knee: Optional[float] = None  # p of the matmuls' soft roofline (read^p + FLOPs^p)^(1/p); null in a file: max
    moe_gemm_half_n: Optional[float] = None  # expert width at which the experts' GEMMs reach half the dense rate
    chunked_prefill: Optional[bool] = None  # the engine's default for the top-level chunked_prefill
    async_scheduling: Optional[bool] = None  # price a step max(host, device), not host + device
    scheduler_steps: Optional[int] = None  # decode steps a scheduling pass runs (V0's --num-scheduler-steps)
    # The default of a top-level max_num_batched_tokens left null: the first tier the card meets. null in a file:
    # DEFAULT_TOKEN_BUDGET.
    token_budget: Optional[List[TokenBudgetTier]] = None
    # What device.utilization is a fraction of when a simulated GPU's KV budget is sized (harness/kv/budget.py):
    # "total" (vLLM's gpu_memory_utilization: the KV cache gets what that share of the card leaves after the
    # weights and activations) or "free" (TensorRT-LLM's free_gpu_memory_fraction: that share of what the weights
    # and activations leave). null in a file: total.
    kv_fraction_of: Optional[str] = None
    # No front-end cost: an offline batch. null: offline when every request arrives at t=0 (arrival=burst).
    offline: Optional[bool] = None


@dataclass
class ScenarioConfig:
    """What every scenario has. Each scenario's module (harness/scenarios/NAME.py) holds its own
    dataclass, a subclass of this one with its keys (``SCHEMA``), stored as the option
    ``scenario=NAME``; a key that belongs to another scenario is an error naming the
    scenario's keys (harness/front/strict.py)."""

    name: str = MISSING

    @property
    def bookkeeping(self) -> bool:
        """No model and no tensors at scale: the scheduler and the cache bookkeeping against a budget."""
        return False





@dataclass
class SearchScenario(ScenarioConfig):
    """A search whose every probe is a run: a decode run (the model on the device) or a
    capacity run (bookkeeping only)."""

    probe: str = "decode"

    @property
    def bookkeeping(self) -> bool:
        return self.probe == "capacity"





@dataclass
class Config:
    # The chosen scenario's dataclass (harness/scenarios/NAME.py: SCHEMA), the option scenario=NAME.
    scenario: ScenarioConfig = field(default_factory=ScenarioConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    arrival: ArrivalConfig = field(default_factory=ArrivalConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    impl: Optional[ImplConfig] = None  # absent: every impl in conf/impl/ (and on Hydra's search path)
    gpu: Optional[GpuConfig] = None  # the simulated clock's GPU (gpu=NAME); absent: no clock
    engine: Optional[EngineConfig] = None  # the serving engine the roofline prices (engine=NAME; gpu=NAME: vllm_v1)
    # The simulated clock priced from a measured profile instead of the roofline: a scenario=profile
    # run folder (or its profile.csv / .parquet); harness/serving/profiled_clock.py. The impl's own
    # profile is used, or ``clock_profile_impl``'s.
    clock_profile: Optional[str] = None
    clock_profile_impl: Optional[str] = None
    # A profile records the model, dtype, KV store, kernel and device that measured it (and kvbench's commit); a
    # run on other settings, or a profile with no record, is refused in one line naming the differences. true:
    # price with it anyway, the row's notes naming them (a commit alone is only ever a note).
    clock_profile_allow_mismatch: bool = False
    batch: int = 8  # most sequences running at once (vLLM's max_num_seqs)
    # Most prompt tokens one prefill forward computes (vLLM's name); a longer prompt runs alone.
    # With chunked_prefill: most tokens of any step, decodes included; longer prompts go in chunks.
    # null: the engine's default for the card and the run's mode with gpu=NAME in a bookkeeping scenario (conf/engine/
    # token_budget: vLLM V1 serves with 2048 on a card under 70 GiB), else DEFAULT_TOKEN_BUDGET.
    max_num_batched_tokens: Optional[int] = None
    # Schedule as vLLM's current engine: each step gives every running sequence its decode token, then
    # computes prompt chunks under the token budget (a mixed step, one forward), instead of a prefill
    # step of whole prompts that stalls every decode (harness/serving/scheduler.py). Both clocks.
    # null: the engine's default with gpu=NAME (conf/engine/), else false.
    chunked_prefill: Optional[bool] = None
    seed: int = 0
    dtype: str = "auto"  # auto (float32 on CPU, bfloat16 on GPU) | float32 | float16 | bfloat16
    max_seq_len: int = 1024
    block_size: int = 16
    # The KV cache's storage (kernels/kv_formats.py): auto (the model's dtype) | fp8_e4m3 | fp8_e5m2 | int8,
    # and a quantized cache's scales: tensor (static, one per layer) | token_head (dynamic, per token and head).
    kv_dtype: str = "auto"
    kv_scale: str = "tensor"
    # The dtype the weights are stored at, for the simulated clock (harness/serving/cost_model.py): auto (``dtype``) |
    # float32 | float16 | bfloat16 | fp8 (one byte a value, the decoder layers' matrices; the embedding and LM head stay
    # at ``dtype``, as an fp8 checkpoint keeps them). Only the roofline reads it: a run that computes keeps ``auto``.
    weight_dtype: str = "auto"
    # How the KV cache lays out a model whose layers attend differently (harness/kv/groups.py): hybrid (one pool,
    # a block table per group of layers of one kind, sliding blocks freed as they leave the window; vLLM's) |
    # uniform (every layer cached as full attention) | split_pools (a static pool per kind; TensorRT-LLM, SGLang).
    # A model of one attention kind has one group: all three give the same pool and rows.
    kv_manager: str = "hybrid"
    # kv_manager=split_pools: tokens the sliding-window pool holds per token of the full-attention pool (SGLang's
    # name and default); the budget is split so. Other managers ignore it.
    swa_full_tokens_ratio: float = 0.8
    # What a preemption does with the victim's KV (paged): recompute (free it, prefill it again later)
    # | swap (copy its blocks to the host tier, device.host_kv_gb > 0, and back when it resumes).
    preemption: str = "recompute"
    # How the simulated clock prices host-tier and swap copies (harness/serving/cost_model.py): batched (one
    # gather copy per layer's K and V and direction per step, as this engine does) | per_block (a copy per
    # block, as vLLM's swap_blocks did when the PagedAttention paper measured swap, its Fig. 19).
    host_copy: str = "batched"
    repeat: int = 1  # run the measured job this many times; rows report the median
    # CPU: torch's intra-op threads (None: the cores other work leaves free at the job's start,
    # all of them on an idle machine). Latency runs on a shared machine want fewer: an OpenMP
    # barrier waits for a thread the OS has descheduled. Rows record the number used.
    cpu_threads: Optional[int] = None
    # Write the per-request and per-step tables (requests, steps) of decode and simulated runs.
    # Large sweeps that publish only their rows turn it off (a 1000-request run's are ~0.6 MB).
    timeline_tables: bool = True
    progress: bool = True
    # Skip the job when its folder already holds its complete rows (same job_id, final
    # statuses); re-run only the impls whose rows are missing, error or interrupted.
    resume: bool = False
    # process: each impl runs in a spawned process of its own, so its memory peaks, NVML
    # baseline and any crash are its alone; auto: process on CUDA, none (in-process) on CPU.
    isolation: str = "auto"
    # Decode steps of up to `batch` sequences replay CUDA graphs of the model's dense work
    # between attention calls (harness/model/piecewise.py); the caches' attention stays eager.
    cuda_graph: bool = False
    # CPU decode steps run the model's forward compiled by inductor as one graph, each cache's attention
    # eager inside it (harness/model/compiled.py). null: on where it repays its compile (compiled.py's
    # auto_compile: small fp32 models, g++ present, a long enough run); true/false force it.
    cpu_compile: Optional[bool] = None
    # CPU fp32: the linears' weights packed once, so eager decode steps run packed GEMMs as a CPU serving
    # engine does: kvbench's own kernel where a C++ compiler builds it, else oneDNN's (harness/model/
    # packed_linear.py). null: on wherever oneDNN applies.
    cpu_prepack: Optional[bool] = None
    # CPU fp32: the element-wise work between the GEMMs (RMSNorm, residual add + norm, RoPE with the q/k/v
    # split, SiLU x up) runs as fused C++ ops in eager forwards (kernels/dense_op.py), as a CPU serving
    # engine runs it. null: on wherever it applies and a C++ compiler builds the ops (else torch's ops).
    cpu_fused: Optional[bool] = None

