"""The names users bring to a command line: vLLM's CLI keys, and ``impl=NAME`` without the ``+``.

Each is rewritten to kvbench's own key before Hydra reads the command line, with one note
line on stderr, so a run written either way is the same job (the same identity, the same rows).
"""

from __future__ import annotations

# vLLM's name -> kvbench's key (``vllm serve`` / ``vllm bench serve`` flags, dashes as underscores).
VLLM_KEYS = {
    "max_num_seqs": "batch",
    "max_model_len": "max_seq_len",
    "num_prompts": "workload.num_requests",
    "gpu_memory_utilization": "device.utilization",
    "enable_prefix_caching": "impl.prefix_caching",
}
# ``request_rate``: vLLM's offered rate, Poisson arrivals; ``inf`` sends every request at once.
RATE = "request_rate"


def translate(argv: list[str]) -> tuple[list[str], list[str]]:
    """``argv`` with the aliases rewritten to kvbench's keys, and one note per alias used."""
    arrival_chosen = any(a.lstrip("+~").startswith("arrival=") for a in argv)
    out: list[str] = []
    notes: list[str] = []
    for arg in argv:
        written, sep, value = arg.partition("=")
        key = written.lstrip("+~")
        prefix = written[: len(written) - len(key)]
        if arg.startswith("-") or not sep:
            out.append(arg)
        elif key == "impl" and not prefix:
            out.append(f"+impl={value}")
            notes.append(f"impl={value} taken as +impl={value} (impl is in no defaults list, so it is added with +)")
        elif key in VLLM_KEYS:
            out.append(f"{prefix}{VLLM_KEYS[key]}={value}")
            notes.append(f"{key}={value} is vLLM's name: taken as {VLLM_KEYS[key]}={value}")
        elif key == RATE and value.strip().lower() in ("inf", "infinity"):
            out.append("arrival=burst")
            notes.append(f"{RATE}={value} is vLLM's name: taken as arrival=burst (every request at t=0)")
        elif key == RATE:
            out += ([] if arrival_chosen else ["arrival=poisson"]) + [f"arrival.rate={value}"]
            notes.append(f"{RATE}={value} is vLLM's name: taken as "
                         + ("" if arrival_chosen else "arrival=poisson ") + f"arrival.rate={value}")
        else:
            out.append(arg)
    return out, notes
