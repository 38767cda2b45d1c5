"""The decode forward compiled as one inductor graph on a CPU, each cache's attention left eager.

On a CPU the dense work (projections, MLP, norms, logits) is most of a small model's
step, and eager torch runs it op by op. ``torch.compile`` (inductor) fuses the
element-wise work around the GEMMs. Compiling the pieces of harness/model/piecewise.py
one by one did not pay on a CPU (0.998x and 1.048x tok/s at batch 32, tiny-llama, fp32,
1 thread: each piece costs ~70 us of guards and dispatch, and padding to a captured
size costs real CPU time). What pays is the whole decode forward as ONE graph with a
dynamic batch dimension, where each layer's attention is an opaque custom op,
``kvbench_model::cache_attention``: inductor neither traces nor fuses into it, and at
run time it calls the active cache's ``forward_decode`` eagerly, so every impl keeps its
own kernel, its own host work and its dynamic shapes, exactly as between CUDA graphs.

The batch dimension is dynamic from 2 up: torch specialises a size of 1, so a batch of
one sequence runs the eager forward rather than compiling a second graph mid-run. The
compile happens once, in the constructor (outside every timed region), on a stand-in
attention that touches no cache; ``compile_s`` says how long it took.

Freezing (``freeze``, on by default for a float32 model on a CPU with oneDNN): inductor
treats the weights as constants and swaps every linear for oneDNN's inner product on a
weight reordered once (``mkldnn._linear_pointwise``), as a CPU serving engine runs its
GEMMs. The graph then holds its own packed copy of the weights as they were at compile
time; a weight changed in place afterwards is an error at the next call, not a silent
mismatch. Measured on tiny-llama and a 58M Llama (tests/bench/cpu_dense_paths.py), fp32,
one thread: see the README's "Compiled dense work on CPU".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from typing import Iterator

import torch
from torch import nn

from kvbench.harness.model.llama import AttentionFn, LlamaModel, prepack_supported
from kvbench.harness.model.support import traced_decode_refusal

# Models above this many parameters are GEMM-bound: the element-wise work inductor
# fuses is a small share of their step, and their compile is longer.
AUTO_MAX_PARAMS = 100_000_000
# A run shorter than this many decode tokens does not win its compile back. Measured (issue 23) on
# tiny-llama and llama-58m, fp32, 1 thread, against eager on pre-packed weights (build_model's default):
# the frozen graph saves 0.1-0.15 ms per decode token at batch 8 and 0.02-0.05 ms at batch 32, and its
# compile costs 9-15 s in a process with a warm inductor cache (the unfrozen graph 3-8 s; freezing
# folds and packs every weight at compile time), so it repays itself at ~80k-500k tokens. make sweep's CPU decode jobs decode 2-4k tokens each
# (and max_rate's probes as many): they stay eager and pay no compile. cpu_compile=true forces it.
AUTO_MIN_DECODE_TOKENS = 200_000


class _ActiveAttention:
    """The attention the custom op calls back into, set for the length of one forward.

    A custom op takes tensors and scalars only, not a Python callable, so the op finds the
    cache's attention here. Set only inside ``CompiledDecode.__call__`` (a context manager
    that restores it), so no attention outlives its step.
    """

    def __init__(self) -> None:
        self.fn: AttentionFn | None = None

    @contextlib.contextmanager
    def use(self, fn: AttentionFn) -> Iterator[None]:
        previous, self.fn = self.fn, fn
        try:
            yield
        finally:
            self.fn = previous


_ACTIVE = _ActiveAttention()


@torch.library.custom_op("kvbench_model::cache_attention", mutates_args=())
def cache_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The active cache's attention of ``layer``: q ``[T, H, D]`` -> ``[T, H, D]`` (a fresh tensor)."""
    fn = _ACTIVE.fn
    if fn is None:
        raise RuntimeError("kvbench_model::cache_attention runs only inside CompiledDecode's forward")
    out = fn(layer, q, k, v).reshape(q.shape)
    # A custom op's output may not alias its inputs: an impl returning a view of q gets a copy.
    if out.untyped_storage().data_ptr() in {t.untyped_storage().data_ptr() for t in (q, k, v)}:
        out = out.clone()
    return out.contiguous()


@cache_attention.register_fake
def _(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(q, memory_format=torch.contiguous_format)


class _DecodeGraph(nn.Module):
    """What inductor compiles: LlamaModel.forward's decode path, attention through the custom op."""

    def __init__(self, model: LlamaModel, frozen: bool) -> None:
        super().__init__()
        self.model = model
        # Read in forward, so dynamo guards on it: a frozen and an unfrozen graph of one model are two
        # compiles (inductor's freezing flag is no part of dynamo's guards).
        self.frozen = frozen

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        model = self.model
        if self.frozen:  # the same graph either way; see __init__
            pass
        h, cos, sin = model.embed(input_ids, positions)
        for layer_idx, layer in enumerate(model.layers):
            q, k, v = layer.before_attention(h, cos, sin)
            h = layer.after_attention(h, cache_attention(layer_idx, q, k, v))
        return model.logits(h)


def auto_compile(model: LlamaModel, device: torch.device, decode_tokens: int) -> tuple[bool, str]:
    """What ``cpu_compile=null`` chooses for a run that decodes ``decode_tokens`` tokens, and why.

    On where the compile repays itself: a CPU, float32 (the only dtype measured), an eager forward
    that does not already run kvbench's own packed GEMM and fused element-wise ops (build_model's
    default where its op library builds: the eager forward is then the faster one, 1.0-1.5x the
    frozen graph's tok/s, tests/bench/vllm_cpu_ratio.py), a model of at most AUTO_MAX_PARAMS
    parameters, a C++ compiler for inductor, and a run long enough that the time saved per token
    outweighs the compile (AUTO_MIN_DECODE_TOKENS).
    """
    if device.type != "cpu":
        return False, f"device {device.type}: cuda_graph is the GPU's way"
    if traced_decode_refusal(model.cfg) is not None:
        return False, "linear_attention layers: their state is read and written by the eager forward"
    if model.dtype != torch.float32:
        return False, f"dtype {model.dtype}: measured at float32 only"
    if model.fused and model.packed_kind == "kvbench":
        return False, "the eager forward runs kvbench's packed GEMM and fused ops, faster than the compiled graph"
    params = sum(p.numel() for p in model.parameters())
    if params > AUTO_MAX_PARAMS:
        return False, f"{params} parameters > {AUTO_MAX_PARAMS}"
    if cxx_compiler() is None:
        return False, "no C++ compiler (inductor's CPU code is C++)"
    if decode_tokens < AUTO_MIN_DECODE_TOKENS:
        return False, f"{decode_tokens} decode tokens < {AUTO_MIN_DECODE_TOKENS}: the compile would not repay itself"
    return True, f"small fp32 model on CPU, {decode_tokens} decode tokens"


def freeze_default(model: LlamaModel) -> bool:
    """Freeze where the linears pack: a float32 model on a CPU with oneDNN (as LlamaModel.prepack),
    unless the environment says ``KVBENCH_CPU_FREEZE=0``."""
    return os.environ.get("KVBENCH_CPU_FREEZE", "1") != "0" and prepack_supported(model.device, model.dtype)


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use on a CPU (``CXX`` or g++/clang++), if present."""
    for name in (os.environ.get("CXX"), "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


class CompiledDecode:
    """Decode logits from the compiled graph; the attention of each layer is ``attention`` (eager)."""

    def __init__(self, model: LlamaModel, max_batch: int, freeze: bool | None = None) -> None:
        if model.device.type != "cpu":
            raise ValueError(f"cpu_compile compiles for a CPU; the model is on {model.device}")
        self.model = model
        self.max_batch = max_batch
        self.freeze = freeze_default(model) if freeze is None else freeze
        self.steps = 0  # forwards that ran the compiled graph (batches of 1 run eagerly)
        # dynamic=False: only the marked batch dimension is dynamic; the model's own sizes stay constants
        # (a later job's other model recompiles rather than turning hidden sizes symbolic).
        self._graph = torch.compile(_DecodeGraph(model, self.freeze), backend="inductor", fullgraph=True, dynamic=False)
        t0 = time.perf_counter()
        self._warm(max(2, min(max_batch, 8)))
        self.compile_s = time.perf_counter() - t0
        # A frozen graph holds the weights as they were at compile time: a later in-place change would
        # go unseen, so each call checks the parameters' version counters (a few microseconds).
        self._weights = [(p, p._version) for p in model.parameters()] if self.freeze else []

    @staticmethod
    def _inputs(input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Staged inputs are views at varying offsets of one buffer: fresh tensors keep the graph's
        # guards on offset and stride from recompiling it.
        ids, pos = input_ids.clone(), positions.clone()
        torch._dynamo.mark_dynamic(ids, 0)
        torch._dynamo.mark_dynamic(pos, 0)
        return ids, pos

    @torch.inference_mode()
    def _warm(self, batch: int) -> None:
        """Compile on a batch of ``batch`` zeros with a stand-in attention (q itself): no cache is touched."""
        zeros = torch.zeros(batch, dtype=torch.long)
        # One compile thread: inductor's pool of compile workers takes seconds to start, more than the
        # few kernels of one decode graph take to build on a small CPU (warm cache, loaded 2-core host:
        # 10 s against 20 s for the first compile of a process).
        with _ACTIVE.use(lambda layer, q, k, v: q), torch._inductor.config.patch(compile_threads=1, freezing=self.freeze):
            self._graph(*self._inputs(zeros, zeros))

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        """Decode logits ``[n, vocab]`` for ``n`` tokens, attending through ``attention``."""
        if input_ids.shape[0] < 2:
            return self.model(input_ids, positions, attention)
        for p, version in self._weights:
            if p._version != version:
                raise RuntimeError("a weight changed after cpu_compile froze it into the graph; compile again")
        self.steps += 1
        with _ACTIVE.use(attention):
            return self._graph(*self._inputs(input_ids, positions))
