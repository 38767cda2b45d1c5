"""Which C++ errors crash the process on this machine: a diagnosis for the GPU check.

On the H200 machine (torch 2.11+cu130, g++ 13.3) a TORCH_CHECK failing inside our op
killed the Python process with SIGSEGV instead of raising RuntimeError, while the same
test passes on CPU machines. Each probe below raises one error from C++ in a fresh
interpreter (faulthandler on) and reports how that process ended,
so one run tells apart "every c10::Error thrown from our library crashes" (a build or
libstdc++ mismatch), "only the checks in the CPU kernel file" and "torch's own too".
With gdb on the PATH, a crashing probe is re-run under it for the native backtrace.

    python .ci/crash_probe.py [REPORT_FILE]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE_TIMEOUT_S = 15  # the GPU check gives the whole probe 60 s

_SETUP = "import torch\nfrom kvbench.kernels.cuda_op import load_op\nload_op()\nops = torch.ops.kvbench\n"
# name -> code that must raise RuntimeError (it prints "raised" when it does)
PROBES = {
    # torch's own C++ check, no extension involved
    "aten shape check": "torch.mm(torch.ones(2, 3), torch.ones(2, 3))",
    # ops.cpp: check_decode, before any kernel (a dtype mismatch)
    "op argument check (ops.cpp)": (
        "q = torch.ones(1, 2, 64); k = torch.ones(4, 8, 1, 64, dtype=torch.float16)\n"
        "ops.paged_decode_attention(q, k, k, torch.zeros(1, 1, dtype=torch.int32),"
        " torch.ones(1, dtype=torch.int32), 1.0)"),
    # paged_attention_cpu.cpp: a block id out of range (the check that crashed)
    "CPU kernel check (paged_attention_cpu.cpp)": (
        "q = torch.ones(1, 2, 64); k = torch.ones(4, 8, 1, 64)\n"
        "ops.paged_decode_attention(q, k, k, torch.full((1, 1), 9, dtype=torch.int32),"
        " torch.ones(1, dtype=torch.int32), 1.0)"),
}


def _script(body: str) -> str:
    return f"{_SETUP}try:\n" + "".join(f"    {line}\n" for line in body.splitlines()) + (
        "except RuntimeError as e:\n    print('raised:', str(e).splitlines()[0][:160])\n"
        "else:\n    print('did not raise')\n")


def _env() -> dict[str, str]:
    # As the tests ran (no C++ stack traces asked for): symbolizing one could itself hang or crash.
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(ROOT)
    return env


def _run(cmd: list[str]) -> tuple[int | None, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=_env(), cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    return p.returncode, (p.stdout + p.stderr).strip()


def _ended(code: int | None) -> str:
    if code is None:
        return "timed out"
    return f"killed by signal {-code}" if code < 0 else f"exit {code}"


def main(report: Path | None) -> int:
    """Each probe's lines are written (and flushed) as it ends: a probe cut short keeps the earlier ones."""
    out = report.open("w") if report else None

    def say(text: str) -> None:
        print(text, flush=True)
        if out is not None:
            out.write(text + "\n")
            out.flush()

    try:
        say(f"python {sys.version.split()[0]}; gdb: {shutil.which('gdb') or 'absent'}")
        for name, body in PROBES.items():
            script = _script(body)
            code, output = _run([sys.executable, "-c", script])
            said = [ln for ln in output.splitlines() if ln.startswith(("raised:", "did not raise"))]
            last = said[-1] if said else "(no verdict printed)"
            say(f"== {name}: {_ended(code)}; {last}")
            if code != 0 or not said:
                say(output[-4000:])
                if shutil.which("gdb"):
                    _, trace = _run(["gdb", "-batch", "-ex", "run", "-ex", "bt 40", "--args",
                                     sys.executable, "-c", script])
                    say("-- gdb backtrace --\n" + trace[-6000:])
    finally:
        if out is not None:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
