"""The job a scenario measures for: its resolved config, run folder, machine, the values decided once per
job (the memo), and the identifiers every row of it carries. Every scenario receives it (``job``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvbench.harness.config import Config, ImplConfig
from kvbench.harness.kv.sizes import kv_bytes_per_token, torch_dtype
from kvbench.harness.measure.fingerprint import Fingerprint
from kvbench.harness.results import run_id

if TYPE_CHECKING:  # a bookkeeping run (scenario=capacity) never needs torch: about a second to import
    import torch

    from kvbench.harness.scenarios.job_workload import JobWorkload


@dataclass
class JobRun:
    cfg: Config
    run_dir: Path
    fingerprint: Fingerprint
    # Values decided or measured once per job (cpu_threads, cpu_compile, the KV budget, the ideal hit rate, the
    # copy bandwidth): one dict, shared by the job's pieces, that travels to an isolated impl's process and
    # back (harness/job/isolation.py), so every impl of the job gets the same.
    memo: dict = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return run_id(self.run_dir)

    @property
    def device(self) -> torch.device:
        import torch

        return torch.device(self.cfg.device.name)

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.cfg.dtype)

    @property
    def kv_groups(self) -> str:
        """The rows' ``kv_groups``: each group kind's layer count under ``kv_manager`` (harness/kv/groups.py)."""
        from kvbench.harness.kv.groups import groups_label, kv_groups

        return groups_label(kv_groups(self.cfg.model, self.cfg.kv_manager))

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.cfg.model, self.cfg.dtype, self.cfg.kv_dtype, self.cfg.kv_scale)

    @property
    def cpu_threads(self) -> int:
        """The intra-op threads this job's CPU work runs on: ``cpu_threads``, or (null) the cores other work
        leaves free at the job's start (harness/measure/contention.py: free_cores). Decided once per job,
        in the memo, so every impl gets the same; rows record the number."""
        if "cpu_threads" not in self.memo:
            from kvbench.harness.measure.contention import free_cores

            self.memo["cpu_threads"] = self.cfg.cpu_threads or free_cores()
        return self.memo["cpu_threads"]

    def kernel_backend(self, impl: ImplConfig | None) -> str | None:
        """The kernel that really ran (kernels.registry.kernel_backend); none for bookkeeping-only runs."""
        if impl is None or self.cfg.scenario.bookkeeping:
            return None
        from kvbench.impls.kinds import cache_kind
        from kvbench.kernels.registry import kernel_backend

        return kernel_backend(impl.kernel, self.device.type, gather=cache_kind(impl.cache, impl.reservation).gathers)

    def identifiers(self, impl: ImplConfig | None, workload: JobWorkload | None) -> dict:
        """The row's identifiers; ``workload=None``: without the drawn workload's digest (drawing it failed)."""
        from kvbench.harness.kv.factory import kv_manager_of
        from kvbench.harness.kv.groups import groups_label, kv_groups

        cfg, w = self.cfg, self.cfg.workload
        drawn = workload if cfg.scenario.name != "kernel" else None
        manager = kv_manager_of(cfg, impl)  # a cache without groups caches every layer as full attention: uniform
        return {
            "run_id": self.run_id,
            "scenario": cfg.scenario.name,
            "impl": impl.name if impl else None,
            "cache": impl.cache if impl else None,
            "kernel": impl.kernel if impl else None,
            "kernel_backend": self.kernel_backend(impl),
            # the prefix cache's eviction policy, where there is one to evict from
            "eviction": impl.eviction if impl and impl.cache == "paged" and impl.prefix_caching else None,
            # the host tier and what preemption does, where a paged pool has them (impls/host_tier.py)
            "host_kv_gb": (cfg.device.host_kv_gb or None) if impl and impl.cache == "paged" else None,
            "preemption": cfg.preemption if impl and impl.cache == "paged" else None,
            # how a simulated clock priced the host copies, where there are any to price
            "host_copy": cfg.host_copy if impl and impl.cache == "paged" and (cfg.device.host_kv_gb or 0) > 0
            and cfg.gpu is not None else None,
            "model": cfg.model.name,
            "dtype": cfg.dtype,
            "kv_dtype": cfg.kv_dtype,
            "kv_scale": cfg.kv_scale if cfg.kv_dtype != "auto" else None,  # a float store has no scales
            "kv_manager": manager,  # how layers of different attention kinds are cached (harness/kv/groups.py)
            "block_size": cfg.block_size,
            "batch": cfg.batch,
            # how steps are scheduled (harness/serving/scheduler.py): whole prompts, or chunks under the budget
            "chunked_prefill": cfg.chunked_prefill if cfg.scenario.name != "kernel" else None,
            "max_num_batched_tokens": cfg.max_num_batched_tokens if cfg.scenario.name != "kernel" else None,
            "max_seq_len": cfg.max_seq_len,
            "workload": w.name,
            "num_requests": w.num_requests,
            "prompt_len": w.prompt_len,
            "output_len": w.output_len,
            "shared_prefix_len": w.shared_prefix_len,
            "n": w.n,
            "seed": cfg.seed,
            "repeat": cfg.repeat,
            # a bookkeeping run computes nothing on threads: the configured number, not a 0.25 s sample of the load
            "cpu_threads": (cfg.cpu_threads if cfg.scenario.bookkeeping else self.cpu_threads)
            if cfg.device.name == "cpu" else None,
            "cuda_graph": cfg.cuda_graph,
            "workload_digest": drawn.digest if drawn is not None else None,
            "trace_sha256": drawn.drawn.trace_sha256 if drawn is not None else None,
            **self.fingerprint.as_dict(),
            "kv_bytes_per_token": self.bytes_per_token,
            "kv_groups": groups_label(kv_groups(cfg.model, manager)),
        }
