"""What every scenario of one run shares: the resolved config, device, requests, model."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from harness.serving.arrivals import arrival_times, ignored_rate_note
from harness.config import Config, ImplConfig
from harness.kv.budget import MemoryBudget, measured_kv_budget
from harness.kv.sizes import kv_bytes_per_token, torch_dtype
from harness.measure.fingerprint import Fingerprint
from harness.results import run_id
from harness.serving.workload import Request, Workload, draw_workload, workload_digest

if TYPE_CHECKING:  # a bookkeeping run (scenario=capacity) never needs torch: about a second to import
    import torch


@dataclass
class JobContext:
    cfg: Config
    run_dir: Path
    fingerprint: Fingerprint
    tokens: list[dict] = field(default_factory=list)  # tokens.jsonl records
    tables: dict = field(default_factory=dict)  # side tables: name -> DataFrame
    memo: dict = field(default_factory=dict)  # values measured once per run (e.g. copy bandwidth)

    def derive(self, cfg: Config) -> "JobContext":
        """A context for a probe run with ``cfg`` (same folder and fingerprint; the built model shared,
        its own tables and tokens)."""
        probe = JobContext(cfg, self.run_dir, self.fingerprint)
        if "model" in self.__dict__:
            probe.__dict__["model"] = self.__dict__["model"]
        # The pieces depend on the model, ``batch`` and ``cuda_graph`` alone. A probe that keeps them (each
        # of max_rate's) replays the parent's graphs, if built; one of another batch (max_concurrency's)
        # captures its own, as a run with that batch would, and has the graph memory of that batch charged.
        same = (cfg.batch, cfg.cuda_graph) == (self.cfg.batch, self.cfg.cuda_graph)
        if same and "decode_pieces" in self.__dict__:
            probe.__dict__["decode_pieces"] = self.__dict__["decode_pieces"]
        return probe

    @property
    def device(self) -> torch.device:
        import torch

        return torch.device(self.cfg.device.name)

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.cfg.dtype)

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.cfg.model, self.cfg.dtype)

    @cached_property
    def workload(self) -> Workload:
        w = self.cfg.workload
        return draw_workload(w, w.num_requests, self.cfg.model.vocab_size, self.cfg.max_seq_len, self.cfg.seed)

    @cached_property
    def requests(self) -> list[Request]:
        """The workload's requests, each with its arrival time (``cfg.arrival``)."""
        wl = self.workload
        times = arrival_times(self.cfg.arrival, len(wl.requests), self.cfg.seed, wl.trace_arrivals)
        return [replace(r, arrival_s=t) for r, t in zip(wl.requests, times)]

    @property
    def workload_notes(self) -> list[str]:
        """What drawing the requests and their arrival times changed (clipped lengths) or ignored
        (an ``arrival.rate`` that the arrival process does not read), for the rows' ``notes``."""
        rate_note = ignored_rate_note(self.cfg.arrival)
        return list(self.workload.notes) + ([rate_note] if rate_note else [])

    @property
    def cpu_threads(self) -> int:
        """The intra-op threads this job's CPU work runs on: ``cpu_threads``, or (null) the cores other work
        leaves free at the job's start (harness/measure/contention.py: free_cores). Decided once per job,
        in the memo that travels to an isolated impl's process and back, so every impl gets the same;
        rows record the number."""
        if "cpu_threads" not in self.memo:
            from harness.measure.contention import free_cores

            self.memo["cpu_threads"] = self.cfg.cpu_threads or free_cores()
        return self.memo["cpu_threads"]

    @cached_property
    def model(self):
        from harness.model.weights import build_model

        if self.device.type == "cpu":  # process-wide: a sweep's later job must not inherit an earlier one's
            import psutil

            from harness.kv.budget import check_host_weights

            import torch

            check_host_weights(self.cfg, psutil.virtual_memory().available)
            torch.set_num_threads(self.cpu_threads)
        return build_model(self.cfg.model, self.dtype, self.device, self.cfg.seed)

    @cached_property
    def decode_pieces(self):
        """cuda_graph=true: the model's decode forward as pieces around the attention, captured as
        CUDA graphs once per run for batches up to ``batch`` (harness/model/piecewise.py); else None."""
        if not self.cfg.cuda_graph:
            return None
        from harness.model.piecewise import PiecewiseDecode

        return PiecewiseDecode(self.model, self.cfg.batch, capture=self.device.type == "cuda")

    def kv_budget(self) -> MemoryBudget:
        """The KV budget (harness/kv/budget.py), measured once per run and shared by its impls."""
        if "budget" not in self.memo:
            self.memo["budget"] = measured_kv_budget(self.cfg, self.device, [len(r.prompt_ids) for r in self.requests],
                                                     lambda: self.model, lambda: self.decode_pieces)
        return self.memo["budget"]

    def sync(self) -> None:
        if self.cfg.device.name == "cuda":
            import torch

            torch.cuda.synchronize()

    def progress(self, total: int, desc: str) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
        """A tqdm bar on a terminal (off in tests and pipes); returns (update, close)."""
        if not self.cfg.progress or not sys.stderr.isatty():
            return None, lambda: None
        from tqdm import tqdm

        bar = tqdm(total=total, desc=desc, unit="tok", leave=False)
        return bar.update, bar.close

    def kernel_backend(self, impl: ImplConfig | None) -> str | None:
        """The kernel that really ran (kernels.registry.kernel_backend); none for bookkeeping-only runs."""
        if impl is None or self.cfg.scenario.bookkeeping:
            return None
        from impls.kinds import cache_kind
        from kernels.registry import kernel_backend

        return kernel_backend(impl.kernel, self.device.type, gather=cache_kind(impl.cache, impl.reservation).gathers)

    def identifiers(self, impl: ImplConfig | None, workload: bool = True) -> dict:
        """The row's identifiers; ``workload=False``: without the drawn workload's digest (drawing it failed)."""
        cfg, w = self.cfg, self.cfg.workload
        workload = workload and cfg.scenario.name != "kernel"
        return {
            "run_id": run_id(self.run_dir),
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
            "model": cfg.model.name,
            "dtype": cfg.dtype,
            "block_size": cfg.block_size,
            "batch": cfg.batch,
            "max_seq_len": cfg.max_seq_len,
            "workload": w.name,
            "num_requests": w.num_requests,
            "prompt_len": w.prompt_len,
            "output_len": w.output_len,
            "shared_prefix_len": w.shared_prefix_len,
            "n": w.n,
            "seed": cfg.seed,
            "repeat": cfg.repeat,
            "cpu_threads": self.cpu_threads if self.cfg.device.name == "cpu" else None,
            "cuda_graph": cfg.cuda_graph,
            "workload_digest": workload_digest(self.requests) if workload else None,
            "trace_sha256": self.workload.trace_sha256 if workload else None,
            **self.fingerprint.as_dict(),
            "kv_bytes_per_token": self.bytes_per_token,
        }
