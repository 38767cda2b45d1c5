"""What a job computes with: the built model, its CUDA-graph pieces and compiled decode forward (each built
on first use, once per job), the CPU decode mode the rows record, and the device's sync and progress bar.
Only the scenarios that run the model receive it (``compute``): a bookkeeping one never builds it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable

from kvbench.harness.errors import ConfigError
from kvbench.harness.scenarios.job_run import JobRun
from kvbench.harness.scenarios.job_workload import JobWorkload

if TYPE_CHECKING:
    from kvbench.harness.measure.pace_meter import PaceMeter
    from kvbench.harness.model.compiled import CompiledDecode
    from kvbench.harness.model.piecewise import PiecewiseDecode

# What a probe of another config (harness/scenarios/context.py ``probe``) keeps of its parent's, once built.
BUILT = ("model", "decode_pieces", "decode_compiled")


@dataclass
class Compute:
    job: JobRun  # the config, the device and the memo (cpu_threads, cpu_compile: decided once per job)
    workload: JobWorkload  # auto cpu_compile weighs the job's decode tokens
    # A validating profile job's meter of the machine's pace (harness/measure/pace_meter.py): its wall runs'
    # engines tick it after their steps; None elsewhere. Its probes share it.
    pace: PaceMeter | None = None

    def shared_with(self, job: JobRun, workload: JobWorkload) -> Compute:
        """The compute of a probe run of ``job`` (another config of the same job): the built model shared;
        the pieces where they fit. The pieces depend on the model, ``batch`` and ``cuda_graph`` alone: a probe
        that keeps them (each of max_rate's) replays the parent's graphs, if built; one of another batch
        (max_concurrency's) captures its own, as a run with that batch would, and has the graph memory of that
        batch charged. The compiled graph depends on the model alone (its batch dimension is dynamic): every
        probe keeps it."""
        probe = Compute(job, workload, self.pace)
        same = (job.cfg.batch, job.cfg.cuda_graph) == (self.job.cfg.batch, self.job.cfg.cuda_graph)
        for name in BUILT:
            if name in self.__dict__ and (name != "decode_pieces" or same):
                probe.__dict__[name] = self.__dict__[name]
        return probe

    @cached_property
    def model(self):
        from kvbench.harness.model.weights import build_model

        cfg, device = self.job.cfg, self.job.device
        if device.type == "cpu":  # process-wide: a sweep's later job must not inherit an earlier one's
            import psutil
            import torch

            from kvbench.harness.kv.budget import check_host_weights

            check_host_weights(cfg, psutil.virtual_memory().available)
            torch.set_num_threads(self.job.cpu_threads)
        return build_model(cfg.model, self.job.dtype, device, cfg.seed, prepack=cfg.cpu_prepack, fuse=cfg.cpu_fused)

    @cached_property
    def decode_pieces(self) -> PiecewiseDecode | None:
        """cuda_graph=true: the model's decode forward as pieces around the attention, captured as
        CUDA graphs once per run for batches up to ``batch`` (harness/model/piecewise.py); else None."""
        if not self.job.cfg.cuda_graph:
            return None
        from kvbench.harness.model.piecewise import PiecewiseDecode

        return PiecewiseDecode(self.model, self.job.cfg.batch, capture=self.job.device.type == "cuda")

    @property
    def cpu_compile(self) -> bool:
        """Whether decode steps run the compiled graph: ``cpu_compile``, or (null) auto_compile's choice for
        this run's decode tokens (every repeat's). Decided once per job, in the memo (as cpu_threads)."""
        memo = self.job.memo
        if "cpu_compile" not in memo:
            from kvbench.harness.model.compiled import auto_compile, cxx_compiler

            cfg, device = self.job.cfg, self.job.device
            chosen = cfg.cpu_compile
            if chosen is None and device.type == "cpu":
                tokens = sum(r.output_len * r.n for r in self.workload.requests) * cfg.repeat
                chosen = auto_compile(self.model, device, tokens)[0]
            if chosen and cxx_compiler() is None:
                raise ConfigError("cpu_compile=true needs a C++ compiler for inductor (g++ or clang++, or CXX): "
                                  "none found; install one or leave cpu_compile null")
            memo["cpu_compile"] = bool(chosen)
        return memo["cpu_compile"]

    @cached_property
    def decode_compiled(self) -> CompiledDecode | None:
        """The decode forward compiled once per job (harness/model/compiled.py) when ``cpu_compile``; else None."""
        if not self.cpu_compile:
            return None
        from kvbench.harness.model.compiled import CompiledDecode

        return CompiledDecode(self.model, self.job.cfg.batch)

    def decode_mode_columns(self) -> dict:
        """The rows' ``cpu_compile`` (CPU only) and ``compile_s`` (the compile, outside every timed region)."""
        from kvbench.harness.model.packed_linear import BACKEND_NAMES

        if self.job.device.type != "cpu":
            return {}
        compiled = self.decode_compiled
        return {"cpu_compile": compiled is not None, "compile_s": compiled.compile_s if compiled else None,
                # which GEMMs the eager dense work ran: kvbench's or oneDNN's on packed weights, or F.linear
                "linear_backend": BACKEND_NAMES.get(self.model.packed_kind, "torch"),
                # and its element-wise work: the fused C++ ops (kernels/dense_op.py), or torch's ops
                "elementwise_backend": "fused_cpp" if self.model.fused else "torch"}

    def sync(self) -> None:
        if self.job.cfg.device.name == "cuda":
            import torch

            torch.cuda.synchronize()

    def progress(self, total: int, desc: str) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
        """A tqdm bar on a terminal (off in tests and pipes); returns (update, close)."""
        if not self.job.cfg.progress or not sys.stderr.isatty():
            return None, lambda: None
        from tqdm import tqdm

        bar = tqdm(total=total, desc=desc, unit="tok", leave=False)
        return bar.update, bar.close
