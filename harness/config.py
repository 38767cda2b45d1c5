"""The structured config schema (one dataclass per config group) and its validation.

Hydra merges conf/*.yaml over these dataclasses; ``validate`` runs once at the
entry point and raises ``ConfigError`` naming the bad key and the allowed values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from harness.model.config import ModelConfig

DTYPES = ("float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
SCENARIOS = ("decode", "capacity", "kernel", "max_concurrency")
PROBES = ("decode", "capacity")
DISTRIBUTIONS = ("fixed", "uniform", "lognormal")
MAX_BLOCK_SIZE = 128


@dataclass
class ImplConfig:
    """A KV-cache implementation: a cache layout plus a decode-attention kernel."""

    name: str = MISSING
    cache: str = "paged"  # contiguous | paged
    kernel: str = "torch"  # sdpa (contiguous only) | torch | triton | cuda
    # Share full blocks across requests by content hash (paged only).
    prefix_caching: bool = True


@dataclass
class WorkloadConfig:
    name: str = "chat"
    distribution: str = "lognormal"  # fixed | uniform | lognormal
    num_requests: Optional[int] = None  # None: equal to the top-level batch
    prompt_len: int = 96  # mean
    output_len: int = 64  # mean
    # uniform: lengths in [mean * (1 - spread), mean * (1 + spread)]
    spread: float = 0.5
    # lognormal: sigma of log(length); the mean of the distribution stays `*_len`
    sigma: float = 0.6
    shared_prefix_len: int = 0  # tokens common to every prompt (a system prompt)
    n: int = 1  # parallel samples per prompt
    vocab_limit: Optional[int] = None  # draw ids below this (default: model vocab)


@dataclass
class DeviceConfig:
    name: str = "auto"  # auto | cpu | cuda
    # A memory budget in GB (1e9 bytes): the simulated device on CPU, an optional cap on GPU.
    memory_gb: Optional[float] = None
    utilization: float = 0.9
    # Fix the KV cache size in GB instead of deriving it (like vLLM's kv_cache_memory_bytes).
    kv_cache_gb: Optional[float] = None
    # Free blocks kept back when admitting (vLLM's watermark), as a fraction of the pool.
    watermark: float = 0.01


@dataclass
class GpuConfig:
    """A GPU for the simulated clock (conf/gpu/NAME.yaml; harness/cost_model.py uses the figures).

    ``gpu=NAME`` fills every figure from the file; any can be overridden, e.g. a measured
    copy bandwidth for ``bandwidth_gbps``. A figure left None is taken from conf/gpu/NAME.yaml.
    """

    name: str = MISSING
    count: int = 1  # GPUs working on one model (tensor parallel)
    memory_gb: Optional[float] = None  # per GPU; the capacity scenario's device.memory_gb defaults to it x count
    bandwidth_gbps: Optional[float] = None  # memory bandwidth per GPU, GB/s
    tflops: Optional[float] = None  # dense bf16/fp16 tensor peak per GPU, TFLOP/s
    bw_efficiency: Optional[float] = None
    flops_efficiency: Optional[float] = None
    step_overhead_us: Optional[float] = None
    interconnect_gbps: Optional[float] = None  # per GPU and direction, GB/s
    interconnect_latency_us: Optional[float] = None


@dataclass
class ScenarioConfig:
    name: str = "decode"  # decode | capacity | kernel
    warmup: int = 1  # decode: warm-up passes; kernel: warm-up calls
    # capacity: numbers of concurrent requests for the memory-vs-concurrency table
    concurrency_points: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 100, 128, 256])
    # kernel: the grid
    batches: List[int] = field(default_factory=lambda: [1, 16, 64])
    contexts: List[int] = field(default_factory=lambda: [128, 1024, 4096])
    block_sizes: List[int] = field(default_factory=lambda: [16])
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    iters: int = 20
    # max_concurrency: how each probe runs (decode: the model; capacity: bookkeeping only)
    probe: str = "decode"
    search_limit: int = 4096  # stop growing the batch here


@dataclass
class Config:
    scenario: ScenarioConfig = field(default_factory=ScenarioConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    impl: Optional[ImplConfig] = None  # absent: every impl available on the device
    gpu: Optional[GpuConfig] = None  # the simulated clock's GPU (gpu=NAME); absent: no clock
    batch: int = 8  # most sequences running at once (vLLM's max_num_seqs)
    # Most prompt tokens one prefill forward computes (vLLM's name); a longer prompt runs alone.
    max_num_batched_tokens: int = 8192
    seed: int = 0
    dtype: str = "auto"  # auto (float32 on CPU, bfloat16 on GPU) | float32 | float16 | bfloat16
    max_seq_len: int = 1024
    block_size: int = 16
    repeat: int = 1  # run the measured job this many times; rows report the median
    progress: bool = True


def register_configs() -> None:
    # Only the root schema: the group files in conf/ are validated against the
    # typed fields of ``Config`` when Hydra merges them.
    ConfigStore.instance().store(name="schema", node=Config)
