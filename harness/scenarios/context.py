"""What every scenario of one run shares: the resolved config, device, requests, model."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from kvbench.harness.serving.arrivals import arrival_times, ignored_rate_note
from kvbench.harness.config import Config, ImplConfig
from kvbench.harness.errors import ConfigError
from kvbench.harness.kv.budget import MemoryBudget, measured_kv_budget
from kvbench.harness.kv.sizes import kv_bytes_per_token, torch_dtype
from kvbench.harness.measure.fingerprint import Fingerprint
from kvbench.harness.results import run_id
from kvbench.harness.serving.workload import Request, Workload, draw_workload, workload_digest

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
        # The compiled graph depends on the model alone (its batch dimension is dynamic): every probe keeps it.
        if "decode_compiled" in self.__dict__:
            probe.__dict__["decode_compiled"] = self.__dict__["decode_compiled"]
        return probe

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

    @cached_property
    def workload(self) -> Workload:
        w = self.cfg.workload
        return draw_workload(w, w.num_requests, self.cfg.model.vocab_size, self.cfg.max_seq_len, self.cfg.seed,
                             model_path=self.cfg.model.path)

    @cached_property
    def requests(self) -> list[Request]:
        """The workload's requests, each with its arrival time (``cfg.arrival``). A closed loop
        (workload.kind=multi_turn): the arrival process times each user's first turn; a later turn's
        arrival is decided by the run (``request_source``), so it stays 0 here."""
        wl = self.workload
        if wl.conversations is not None:
            times = arrival_times(self.cfg.arrival, len(wl.conversations), self.cfg.seed)
            first = {ids[0]: t for ids, t in zip(wl.conversations, times)}
            return [replace(r, arrival_s=first.get(r.request_id, 0.0)) for r in wl.requests]
        times = arrival_times(self.cfg.arrival, len(wl.requests), self.cfg.seed, wl.trace_arrivals)
        if not any(times):  # a burst: the drawn requests (each arrives at 0) as they are
            return list(wl.requests)
        # Request(...) rather than dataclasses.replace, which reads every field by name: 0.4 s per 100,000.
        return [Request(r.request_id, r.prompt_ids, r.output_len, r.n, t) for r, t in zip(wl.requests, times)]

    @cached_property
    def workload_digest(self) -> str:
        """``workload_digest(requests)``: the one drawing made, while every request arrives at once (an arrival
        at 0 adds nothing to a request's record)."""
        made = self.workload.digest
        if made is not None and not any(r.arrival_s for r in self.requests):
            return made
        return workload_digest(self.requests)

    def request_source(self):
        """A fresh closed-loop source for one run of the requests (harness/serving/closed_loop.py), or
        None where every arrival is known in advance (the run takes ``requests`` as they are)."""
        wl = self.workload
        if wl.conversations is None:
            return None
        from kvbench.harness.serving.closed_loop import ClosedLoopSource

        reqs = self.requests
        return ClosedLoopSource(reqs, wl.conversations, wl.think_s, [reqs[ids[0]].arrival_s for ids in wl.conversations])

    def ideal_hit_rate(self) -> float | None:
        """The workload's prefix-cache hit rate with an unbounded cache (harness/serving/prefix_reuse.py),
        over the requests in arrival order (a closed loop's request order is one it can take); once per run."""
        if "ideal_hit_rate" not in self.memo:
            from kvbench.harness.serving.prefix_reuse import ideal_prefix_reuse

            order = sorted(self.requests, key=lambda r: (r.arrival_s, r.request_id))
            if self.workload.conversations is not None:
                order = self.requests  # turn by turn: every user's turns in order
            self.memo["ideal_hit_rate"] = ideal_prefix_reuse((r.prompt_ids for r in order), self.cfg.block_size).hit_rate
        return self.memo["ideal_hit_rate"]

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
            from kvbench.harness.measure.contention import free_cores

            self.memo["cpu_threads"] = self.cfg.cpu_threads or free_cores()
        return self.memo["cpu_threads"]

    @cached_property
    def model(self):
        from kvbench.harness.model.weights import build_model

        if self.device.type == "cpu":  # process-wide: a sweep's later job must not inherit an earlier one's
            import psutil

            from kvbench.harness.kv.budget import check_host_weights

            import torch

            check_host_weights(self.cfg, psutil.virtual_memory().available)
            torch.set_num_threads(self.cpu_threads)
        return build_model(self.cfg.model, self.dtype, self.device, self.cfg.seed, prepack=self.cfg.cpu_prepack,
                           fuse=self.cfg.cpu_fused)

    @cached_property
    def decode_pieces(self):
        """cuda_graph=true: the model's decode forward as pieces around the attention, captured as
        CUDA graphs once per run for batches up to ``batch`` (harness/model/piecewise.py); else None."""
        if not self.cfg.cuda_graph:
            return None
        from kvbench.harness.model.piecewise import PiecewiseDecode

        return PiecewiseDecode(self.model, self.cfg.batch, capture=self.device.type == "cuda")

    @property
    def cpu_compile(self) -> bool:
        """Whether decode steps run the compiled graph: ``cpu_compile``, or (null) auto_compile's choice for
        this run's decode tokens (every repeat's). Decided once per job, in the memo (as cpu_threads)."""
        if "cpu_compile" not in self.memo:
            from kvbench.harness.model.compiled import auto_compile, cxx_compiler

            chosen = self.cfg.cpu_compile
            if chosen is None and self.device.type == "cpu":
                tokens = sum(r.output_len * r.n for r in self.requests) * self.cfg.repeat
                chosen = auto_compile(self.model, self.device, tokens)[0]
            if chosen and cxx_compiler() is None:
                raise ConfigError("cpu_compile=true needs a C++ compiler for inductor (g++ or clang++, or CXX): "
                                  "none found; install one or leave cpu_compile null")
            self.memo["cpu_compile"] = bool(chosen)
        return self.memo["cpu_compile"]

    @cached_property
    def decode_compiled(self):
        """The decode forward compiled once per job (harness/model/compiled.py) when ``cpu_compile``; else None."""
        if not self.cpu_compile:
            return None
        from kvbench.harness.model.compiled import CompiledDecode

        return CompiledDecode(self.model, self.cfg.batch)

    def decode_mode_columns(self) -> dict:
        """The rows' ``cpu_compile`` (CPU only) and ``compile_s`` (the compile, outside every timed region)."""
        from kvbench.harness.model.packed_linear import BACKEND_NAMES

        if self.device.type != "cpu":
            return {}
        compiled = self.decode_compiled
        return {"cpu_compile": compiled is not None, "compile_s": compiled.compile_s if compiled else None,
                # which GEMMs the eager dense work ran: kvbench's or oneDNN's on packed weights, or F.linear
                "linear_backend": BACKEND_NAMES.get(self.model.packed_kind, "torch"),
                # and its element-wise work: the fused C++ ops (kernels/dense_op.py), or torch's ops
                "elementwise_backend": "fused_cpp" if self.model.fused else "torch"}

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
        from kvbench.impls.kinds import cache_kind
        from kvbench.kernels.registry import kernel_backend

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
            # how a simulated clock priced the host copies, where there are any to price
            "host_copy": cfg.host_copy if impl and impl.cache == "paged" and (cfg.device.host_kv_gb or 0) > 0
            and cfg.gpu is not None else None,
            "model": cfg.model.name,
            "dtype": cfg.dtype,
            "kv_dtype": cfg.kv_dtype,
            "kv_scale": cfg.kv_scale if cfg.kv_dtype != "auto" else None,  # a float store has no scales
            "kv_manager": cfg.kv_manager,  # how layers of different attention kinds are cached (harness/kv/groups.py)
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
            "workload_digest": self.workload_digest if workload else None,
            "trace_sha256": self.workload.trace_sha256 if workload else None,
            **self.fingerprint.as_dict(),
            "kv_bytes_per_token": self.bytes_per_token,
            "kv_groups": self.kv_groups,
        }
