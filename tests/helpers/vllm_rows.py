"""A decode row and its requests table as the decode scenario builds them, and the vLLM fixture file:
what the vLLM JSON tests (harness/results/vllm_json.py, harness/report/external.py) share."""

from __future__ import annotations

from kvbench.harness.config import ArrivalConfig, SloConfig
from kvbench.harness.serving.sequence import Sequence
from kvbench.harness.serving.service_metrics import service_columns
from kvbench.harness.serving.workload import Request
from tests.conftest import REPO_ROOT

# A vllm bench serve --save-result --save-detailed file, written by hand in vLLM's keys and units
# (vllm/benchmarks/serve.py): 4 prompts at 2 req/s, Poisson, latencies from per-request figures.
FIXTURE = REPO_ROOT / "tests" / "helpers" / "vllm_bench_serve_result.json"
# The row's figures a vLLM file carries, listed here rather than taken from the mapping under test.
FIGURES = ("model", "num_requests", "duration_s", "wall_s", "rejected", "prompt_tokens", "output_tokens",
           "achieved_rps", "goodput_rps", "output_tokens_per_s", "tokens_per_s", "normalized_latency_s",
           "arrival", "request_rate", "slo", "status",
           *[f"{m}_ms_{s}" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "p50", "p90", "p99")])


def seq(request_id: int, arrival: float, token_s: list[float], prompt_len: int, sample: int = 0) -> Sequence:
    s = Sequence(0, request_id, sample, list(range(prompt_len)), len(token_s), arrival_s=arrival,
                 admitted_s=arrival + 0.01, first_token_s=token_s[0], finish_s=token_s[-1], token_s=list(token_s))
    s.output_ids = [7] * len(token_s)
    return s


SEQS = [seq(0, 0.0, [0.05, 0.07, 0.10, 0.12], 5), seq(1, 0.3, [0.41, 0.45, 0.52], 8),
        seq(2, 0.6, [0.90, 0.93, 0.99, 1.02, 1.10], 3)]


def decode_row(seqs=SEQS, arrival=ArrivalConfig("poisson", rate=2.0), rejected: int = 0) -> dict:
    """A decode row as the decode scenario builds it, from the same service metrics (repeat=1)."""
    requests = [Request(s.request_id, tuple(s.prompt_ids), s.output_len, 1, s.arrival_s) for s in seqs]
    duration = max(s.finish_s for s in seqs)
    prompt, output = sum(len(s.prompt_ids) for s in seqs), sum(len(s.output_ids) for s in seqs)
    row = {"scenario": "decode", "status": "ok", "impl": "paged_torch", "model": "tiny-llama",
           "num_requests": len(seqs) + rejected, "rejected": rejected, "prompt_tokens": prompt,
           "output_tokens": output, "wall_s": duration, "tokens_per_s": (prompt + output) / duration,
           "output_tokens_per_s": output / duration, "measured_at": "2025-06-12T10:15:30+00:00",
           **service_columns(arrival, SloConfig(ttft_ms=100.0), requests, seqs, duration, 0.0, "wall")}
    return row
