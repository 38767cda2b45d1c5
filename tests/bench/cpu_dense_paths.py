"""CPU decode throughput of each impl under each way of running the model's dense work, side by side.

Not a test (nothing here asserts a speed): ``python -m tests.bench.cpu_dense_paths --model tiny-llama``.
The variants (issue 23), all on one model built once, every cache's attention eager and its own:

- ``eager``: plain ``F.linear`` (MKL sgemm) per op, as before pre-packing (``prepack=False``);
- ``onednn``: eager, the linears on oneDNN with weights reordered once (the default before kvbench's
  own GEMM);
- ``packed``: eager, the linears on kvbench's packed GEMM (harness/model/packed_linear.py);
- ``fused``: ``packed``, and the element-wise work between the GEMMs as fused C++ ops
  (kernels/dense_op.py): build_model's default on CPU fp32;
- ``compiled``: cpu_compile's inductor graph without freezing (what cpu_compile ran before);
- ``frozen``: cpu_compile's graph with inductor's freezing, which packs the linears itself.

The same 32 prompts (fixed length) and fixed output lengths for every run; rounds interleave every
(variant, impl, batch), so a change in machine load hits all of them; medians over rounds are printed
with the 1-minute load average read before each run. The compiles happen before the first round and
are printed, outside every timed run. Each impl's tokens must be identical across the variants.
"""

from __future__ import annotations

import argparse
import statistics
import time

import kvbench.harness  # noqa: F401  (MKL threading fixed before torch loads)
import kvbench.kernels.triton_mode  # noqa: F401  (Triton interpreter switch, before any kernel import)
import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from kvbench.harness.front.resolve import resolve
from kvbench.harness.front.schemas import register_configs
from kvbench.harness.kv.factory import build_cache
from kvbench.harness.model.compiled import CompiledDecode
from kvbench.harness.model.llama import Linear
from kvbench.harness.model.weights import build_model
from kvbench.harness.serving.engine import Engine
from kvbench.harness.serving.workload import Request
from tests.conftest import REPO_ROOT

IMPLS = ("contiguous", "paged_torch", "paged_cuda")
VARIANTS = ("eager", "onednn", "packed", "fused", "compiled", "frozen")
PACKS = {"onednn": "onednn", "packed": "kvbench", "fused": "kvbench"}  # the variants' packed GEMM kinds


def config(model: str, impl: str, batch: int, block: int, max_seq_len: int, path: str | None = None):
    register_configs()
    overrides = ["progress=false", f"+impl={impl}", f"model={model}", "dtype=float32", "device=cpu",
                 f"block_size={block}", f"batch={batch}", f"max_seq_len={max_seq_len}", "cpu_compile=false",
                 "cpu_threads=1"]
    if path:
        overrides += [f"model.path={path}", "model.weights=path"]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base=None):
        return resolve(hydra_compose("config", overrides=overrides))


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def prompts(vocab: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=gen).tolist()


class DenseBench:
    """One model built once (plain weights, packed on demand), its compiled graphs, and one engine run
    per (variant, impl, batch) over the same requests."""

    def __init__(self, model_name: str, path: str | None, batches: list[int], impls: list[str], variants: list[str],
                 requests_ids: list[list[int]], new_tokens: int, block: int = 32) -> None:
        self.batches, self.impls, self.variants = batches, impls, variants
        max_len = max(len(p) for p in requests_ids) + new_tokens
        max_seq_len = -(-max_len // block) * block
        base = config(model_name, impls[0], max(batches), block, max_seq_len, path)
        self.model = model = build_model(base.model, torch.float32, torch.device("cpu"), base.seed, prepack=False,
                                         fuse=False)
        self.requests = [Request(i, tuple(p), new_tokens) for i, p in enumerate(requests_ids)]
        self.compiled: dict[str, CompiledDecode] = {}
        for variant, freeze in (("compiled", False), ("frozen", True)):
            if variant in variants:
                t0 = time.perf_counter()
                self.compiled[variant] = CompiledDecode(model, max(batches), freeze=freeze)
                print(f"{variant}: compile {self.compiled[variant].compile_s:.2f} s "
                      f"(constructor {time.perf_counter() - t0:.2f} s)", flush=True)
        self._packs = {}  # kind -> (each Linear's packed weight, the logits')
        for kind in sorted({PACKS[v] for v in variants if v in PACKS}):
            t0 = time.perf_counter()
            model.prepack(kind)
            print(f"prepack {kind} {1e3 * (time.perf_counter() - t0):.1f} ms", flush=True)
            self._packs[kind] = ({m: m.packed for m in model.modules() if isinstance(m, Linear)}, model.head_packed)
        model.unpack()
        self.cfgs = {(impl, b): config(model_name, impl, b, block, max_seq_len, path) for impl in impls for b in batches}
        cfg = model.cfg
        self.budget = len(requests_ids) * max_seq_len * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4 * 2
        for variant in variants:  # warm-up: every (variant, impl, batch) once, on two short requests
            for impl in impls:
                for b in batches:
                    self.run(variant, impl, b, [Request(r.request_id, r.prompt_ids, 4) for r in self.requests[:2]])

    def _set_variant(self, variant: str) -> None:
        self.model.unpack()
        if variant in PACKS:
            linears, head = self._packs[PACKS[variant]]
            for m, p in linears.items():
                m.packed = p
            self.model.head_packed = head
        self.model.fuse_elementwise(variant == "fused")

    def run(self, variant: str, impl: str, batch: int, requests: list[Request] | None = None):
        """One engine run; returns (output tok/s, median decode step s, each request's output ids)."""
        cfg = self.cfgs[(impl, batch)]
        self._set_variant(variant)
        cache = build_cache(cfg.impl, cfg, self.budget, torch.device("cpu"))
        engine = Engine(self.model, cache, batch, cfg.max_num_batched_tokens, compiled=self.compiled.get(variant))
        res = engine.run(requests or self.requests)
        out = sum(len(s.output_ids) for s in res.sequences)
        return out / res.elapsed_s, statistics.median(res.step_s), [s.output_ids for s in res.sequences]


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """The workload and rounds both side-by-side scripts take (this one and vllm_cpu_ratio.py)."""
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--impls", nargs="+", default=list(IMPLS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--path", default=None, help="a HF checkpoint folder (model.path)")
    add_run_args(parser)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    vocab = config(args.model, args.impls[0], 8, args.block, 64, args.path).model.vocab_size
    bench = DenseBench(args.model, args.path, args.batches, args.impls, args.variants,
                       prompts(vocab, args.prompts, args.prompt_len), args.new_tokens, args.block)
    rows: dict[tuple[str, str, int], list[tuple[float, float, float]]] = {}
    tokens: dict[tuple[str, str, int], list] = {}
    for rnd in range(args.rounds):
        for b in args.batches:
            for impl in args.impls:
                for variant in args.variants:
                    load = loadavg()
                    tps, step, ids = bench.run(variant, impl, b)
                    rows.setdefault((variant, impl, b), []).append((tps, step, load))
                    tokens[(variant, impl, b)] = ids
        print(f"round {rnd + 1}/{args.rounds} done, load {loadavg():.2f}", flush=True)
    print(f"\nmodel={args.model} prompts={args.prompts}x{args.prompt_len} new_tokens={args.new_tokens} block={args.block} "
          f"threads=1 rounds={args.rounds} (medians; load = 1-min loadavg before each run, min-max)")
    print(f"{'batch':>5} {'impl':12s} " + " ".join(f"{v:>18s}" for v in args.variants) + "   same tokens as eager")
    for b in args.batches:
        for impl in args.impls:
            cells = []
            for v in args.variants:
                r = rows[(v, impl, b)]
                cells.append(f"{statistics.median(x[0] for x in r):8.1f} ({statistics.median(x[1] for x in r) * 1e3:6.2f}ms)")
            ref = tokens[(args.variants[0], impl, b)]
            same = all(tokens[(v, impl, b)] == ref for v in args.variants)
            loads = [x[2] for v in args.variants for x in rows[(v, impl, b)]]
            print(f"{b:5d} {impl:12s} " + " ".join(f"{c:>18s}" for c in cells)
                  + f"   {same}  load {min(loads):.2f}-{max(loads):.2f}")
    # paired ratios against the first variant, per round (the figure least moved by load)
    print("\npaired speed-up over " + args.variants[0] + " (median over rounds of the per-round ratio)")
    for b in args.batches:
        for impl in args.impls:
            base_r = rows[(args.variants[0], impl, b)]
            cells = [f"{v} {statistics.median(x[0] / y[0] for x, y in zip(rows[(v, impl, b)], base_r)):.2f}x"
                     for v in args.variants[1:]]
            print(f"{b:5d} {impl:12s} " + "  ".join(cells))
    print("cells: output tok/s (median decode step)")


if __name__ == "__main__":
    main()
