"""The element-wise work of a decode step, each piece timed both ways through the model's own modules.

Not a test (nothing here asserts a speed). A model is built as a run builds it (dummy weights, float32 on
the CPU, one thread); each piece of its first layer's element-wise work, and the greedy pick over the
logits, is timed with the model fused (kernels/dense_op.py's C++ ops, ``LlamaModel.fuse_elementwise``) and
with torch's ops, on the same random inputs:

    python -m tests.bench.cpu_fused_ops --model llama-58m --rows 8 32

Each (piece, rows, way) is the median of 9 repeats of 200 calls, in microseconds a call; a step runs
``per step`` of each (a norm twice a layer plus the final one, the others once a layer, greedy once).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import kvbench.harness  # noqa: F401  (MKL threading fixed before torch loads)
import torch

from kvbench.harness.model.llama import LlamaModel
from kvbench.harness.model.weights import build_model
from tests.bench.cpu_dense_paths import config, loadavg


def per_call_us(fn: Callable[[], object], calls: int = 200, repeats: int = 9) -> float:
    fn()  # first call: allocations, the library's dispatch
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def pieces(model: LlamaModel, rows: int, gen: torch.Generator) -> dict[str, tuple[Callable[[], object], int]]:
    """Each element-wise piece of a decode step on ``rows`` tokens, and how many a step runs."""
    cfg = model.cfg
    layer = model.layers[0]
    attn = layer.self_attn
    h = torch.randn(rows, cfg.hidden_size, generator=gen)
    delta = torch.randn(rows, cfg.hidden_size, generator=gen)
    qkv = torch.randn(rows, cfg.q_size + 2 * cfg.kv_size, generator=gen)
    gate_up = torch.randn(rows, 2 * cfg.intermediate_size, generator=gen)
    logits = torch.randn(rows, cfg.vocab_size, generator=gen)
    _, cos, sin = model.embed(torch.zeros(rows, dtype=torch.long), torch.arange(rows) + 100)
    n = cfg.num_layers
    return {
        "rms_norm": (lambda: layer.input_layernorm(h), n + 1),
        "add + rms_norm": (lambda: layer.add_norm(h, delta), n),
        "rope + q/k/v split": (lambda: attn.split_rotate(qkv, cos, sin), n),
        "silu x up": (lambda: layer.mlp.activate(gate_up), n),
        "greedy (argmax)": (lambda: model.greedy(logits), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-58m")
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32])
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = config(args.model, "paged_cuda", max(args.rows), 32, 256)
    model = build_model(cfg.model, torch.float32, torch.device("cpu"), cfg.seed, prepack=False, fuse=True)
    gen = torch.Generator().manual_seed(0)
    print(f"{args.model}: {model.cfg.num_layers} layers, hidden {model.cfg.hidden_size}, "
          f"vocab {model.cfg.vocab_size}; 1 thread; load {loadavg():.2f}")
    print(f"{'piece':20s} {'rows':>4} {'torch µs':>9} {'fused µs':>9} {'x':>5} {'per step':>8} {'saved µs/step':>13}")
    for rows in args.rows:
        total = 0.0
        for name, (fn, count) in pieces(model, rows, gen).items():
            model.fuse_elementwise(False)
            plain = per_call_us(fn)
            model.fuse_elementwise(True)
            fused = per_call_us(fn)
            total += (plain - fused) * count
            print(f"{name:20s} {rows:4d} {plain:9.1f} {fused:9.1f} {plain / fused:5.1f} {count:8d} "
                  f"{(plain - fused) * count:13.0f}")
        print(f"{'all':20s} {rows:4d} {'':9s} {'':9s} {'':5s} {'':8s} {total:13.0f}")


if __name__ == "__main__":
    main()
