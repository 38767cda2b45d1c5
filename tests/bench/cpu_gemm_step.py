"""A decode step's GEMMs alone, on one thread, per kernel: how fast each streams a model's weights.

Not a test (nothing here asserts a speed). Every layer's weights are their own tensors, so a step
reads them all from DRAM as a real step does (one weight timed alone sits in cache and measures
the arithmetic only). Shapes default to the 58M Llama of issue 23 (hidden 512, MLP 1536, 8 layers,
8/4 heads of 64, vocab 32000):

    python -m tests.bench.cpu_gemm_step --rows 1 8 32 --kernels kvbench onednn torch

``vllm`` (vLLM's oneDNN matmul, ``_custom_ops.onednn_mm``) runs only in a Python that has vLLM:
``/tmp/vllm-venv/bin/python tests/bench/cpu_gemm_step.py --kernels vllm``. Each (rows, kernel) is
measured in 7 repeats of 20 steps, the median printed with the achieved weight bandwidth.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch


def weights(hidden: int, inter: int, layers: int, q: int, kv: int, vocab: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = [(q + 2 * kv, hidden), (hidden, q), (2 * inter, hidden), (hidden, inter)] * layers + [(vocab, hidden)]
    return [torch.randn(n, k, generator=gen) * k ** -0.5 for n, k in shapes]


def kernel(name: str):
    """(pack, linear) for one kernel."""
    if name == "kvbench":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        from kvbench.kernels import dense_op

        return (lambda w: (dense_op.pack_linear_weight(w), w.shape[0]),
                lambda x, p: dense_op.packed_linear(x, p[0], p[1]))
    if name == "onednn":
        return (lambda w: torch.ops.mkldnn._reorder_linear_weight(w, None),
                lambda x, p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""))
    if name == "torch":
        return (lambda w: w, lambda x, w: torch.nn.functional.linear(x, w))
    if name == "vllm":
        from vllm import _custom_ops as ops

        return (lambda w: ops.create_onednn_mm(w.t(), 32), lambda x, h: ops.onednn_mm(h, x, None))
    raise SystemExit(f"unknown kernel {name!r}: choose kvbench, onednn, torch or vllm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--kernels", nargs="+", default=["kvbench", "onednn", "torch"])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--inter", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--q", type=int, default=512)
    parser.add_argument("--kv", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    ws = weights(args.hidden, args.inter, args.layers, args.q, args.kv, args.vocab)
    nbytes = sum(w.numel() * w.element_size() for w in ws)
    print(f"{len(ws)} weights, {nbytes / 1e6:.0f} MB a step; load {os.getloadavg()[0]:.2f}")
    for name in args.kernels:
        pack, lin = kernel(name)
        packed = [pack(w) for w in ws]
        for rows in args.rows:
            xs = {k: torch.randn(rows, k) for k in {w.shape[1] for w in ws}}

            def step() -> None:
                for w, p in zip(ws, packed):
                    lin(xs[w.shape[1]], p)

            for _ in range(3):
                step()
            times = []
            for _ in range(7):
                t0 = time.perf_counter()
                for _ in range(20):
                    step()
                times.append((time.perf_counter() - t0) / 20)
            t = statistics.median(times)
            print(f"rows {rows:3d} {name:8s} {t * 1e3:7.2f} ms a step  {nbytes / t / 1e9:5.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
