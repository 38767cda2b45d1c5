"""CPU decode throughput of every impl next to Hugging Face ``generate``, side by side.

Not a test (nothing here asserts a speed): ``python -m tests.bench.cpu_vs_hf_generate``.
One checkpoint of a kvbench CPU shape (``--model``: tiny-llama or llama-58m; random O(1) weights,
saved once), one batch of
fixed-length prompts (so ``generate`` batches them without padding), one thread for
both sides. Rounds interleave the contenders (HF, then each impl), so a change in
machine load hits all of them; medians over rounds are printed, and ``x hf`` is the
median over rounds of (generate's wall / the impl's wall in the same round), the
figure least moved by load. Output tokens/s counts prefill too, as the decode rows
do; every impl must generate exactly ``generate``'s greedy tokens.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import kvbench.harness  # noqa: F401  (MKL threading fixed before torch loads)
import kvbench.kernels.triton_mode  # noqa: F401  (Triton interpreter switch, before any kernel import)
import torch

from kvbench.harness.serving.engine import Engine, EngineResult
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.weights import build_model
from kvbench.harness.serving.workload import Request
from kvbench.impls.base import KVCache
from kvbench.impls.block_manager import BlockManager
from kvbench.impls.contiguous import ContiguousCache
from kvbench.impls.paged import PagedCache
from kvbench.impls.lane_allocator import LaneAllocator
from kvbench.kernels.registry import get_paged_kernel
from kvbench.harness.model.compiled import CompiledDecode
from tests.helpers.checkpoints import SHAPES, write_llama_checkpoint

IMPLS = ("contiguous", "paged_torch", "paged_cuda")


def tiny_llama_checkpoint(folder: Path, shape: str = "tiny-llama") -> None:
    """conf/model/<shape>.yaml's shape as a HF LlamaForCausalLM, weights O(1) (tests/helpers/checkpoints.py)."""
    write_llama_checkpoint(folder, shape)


def make_cache(impl: str, cfg: ModelConfig, max_len: int, batch: int) -> KVCache:
    tensors = dict(num_layers=cfg.num_layers, num_heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                   head_dim=cfg.head_dim, dtype=torch.float32, device=torch.device("cpu"), bytes_per_token=1)
    if impl == "contiguous":
        return ContiguousCache(LaneAllocator(batch, max_len), **tensors)
    blocks = batch * -(-max_len // 16)
    return PagedCache(get_paged_kernel(impl.removeprefix("paged_")), BlockManager(blocks, 16), **tensors)


def hf_runner(folder: Path, prompts: torch.Tensor, new_tokens: int) -> Callable[[], tuple[float, float, list]]:
    """One round of ``generate``: (wall, wall of a 1-token generate = its prefill, new tokens)."""
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None

    def generate(ids: torch.Tensor, n: int) -> torch.Tensor:
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0)

    def run() -> tuple[float, float, list]:
        with torch.inference_mode():
            t0 = time.perf_counter()
            generate(prompts, 1)
            t1 = time.perf_counter()
            out = generate(prompts, new_tokens)
            return time.perf_counter() - t1, t1 - t0, out[:, prompts.shape[1]:].tolist()

    with torch.inference_mode():
        generate(prompts[:, :8], 4)  # warm-up
    return run


def engine_runner(impl: str, folder: Path, prompts: torch.Tensor, new_tokens: int,
                  compiled: bool = False) -> Callable[[], EngineResult]:
    """kvbench's default CPU model (eager, linears pre-packed for oneDNN); ``compiled``: cpu_compile's
    frozen inductor graph, compiled here (outside every timed run)."""
    cfg = resolve_model_config(ModelConfig(path=str(folder)))
    model = build_model(cfg, torch.float32, "cpu", seed=0)
    batch, max_len = prompts.shape[0], prompts.shape[1] + new_tokens
    graph = CompiledDecode(model, batch) if compiled else None
    requests = [Request(i, tuple(p), new_tokens) for i, p in enumerate(prompts.tolist())]
    budget = batch * max_len  # the whole batch prefilled in one forward, as generate() does
    Engine(model, make_cache(impl, cfg, max_len, batch), batch, budget, compiled=graph).run(
        [Request(r.request_id, r.prompt_ids[:8], 4) for r in requests])  # warm-up
    return lambda: Engine(model, make_cache(impl, cfg, max_len, batch), batch, budget, compiled=graph).run(requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=96)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--impls", nargs="+", default=list(IMPLS))
    parser.add_argument("--model", default="tiny-llama", choices=list(SHAPES))
    parser.add_argument("--cpu-compile", action="store_true", help="also each impl under cpu_compile's frozen graph")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    vocab = SHAPES[args.model]["vocab_size"]
    prompts = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(0))
    tokens = args.batch * args.new_tokens
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tiny_llama_checkpoint(folder, args.model)
        hf = hf_runner(folder, prompts, args.new_tokens)
        ours = {impl: engine_runner(impl, folder, prompts, args.new_tokens) for impl in args.impls}
        if args.cpu_compile:
            ours |= {f"{impl}+compile": engine_runner(impl, folder, prompts, args.new_tokens, compiled=True)
                     for impl in args.impls}
        hf_rounds, our_rounds = [], {impl: [] for impl in args.impls}
        for _ in range(args.rounds):
            hf_rounds.append(hf())
            for impl, run in ours.items():
                our_rounds[impl].append(run())
    print(f"threads={args.threads} batch={args.batch} prompt_len={args.prompt_len} new_tokens={args.new_tokens} "
          f"rounds={args.rounds} (medians)")
    wall = statistics.median(r[0] for r in hf_rounds)
    prefill = statistics.median(r[1] for r in hf_rounds)
    # HF's decode step: (generate - its 1-token run) / the other new tokens.
    print(f"{'hf_generate':18s} {tokens / wall:7.1f} output tok/s  wall {wall * 1e3:6.1f} ms  "
          f"prefill {prefill * 1e3:5.1f} ms  step {(wall - prefill) / (args.new_tokens - 1) * 1e3:.3f} ms")
    hf_tokens = hf_rounds[-1][2]
    for impl, results in our_rounds.items():
        wall = statistics.median(r.elapsed_s for r in results)
        prefill = statistics.median(r.elapsed_s - sum(r.step_s) for r in results)
        step = statistics.median(statistics.median(r.step_s) for r in results)
        host = statistics.median(statistics.median(r.host_s) for r in results)
        paired = statistics.median(h[0] / r.elapsed_s for h, r in zip(hf_rounds, results))
        same = all([s.output_ids for s in r.sequences] == hf_tokens for r in results)
        print(f"{impl:18s} {tokens / wall:7.1f} output tok/s  wall {wall * 1e3:6.1f} ms  prefill {prefill * 1e3:5.1f} ms"
              f"  step p50 {step * 1e3:.3f} ms  host p50 {host * 1e3:.3f} ms  x hf {paired:.3f}  "
              f"{'same tokens' if same else 'TOKENS DIFFER'}")


if __name__ == "__main__":
    main()
