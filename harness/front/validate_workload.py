"""The checks of the load a job serves: workload=NAME's keys (a trace's or a text's file keys, the reuse
kinds: multi_turn, system_prompt), arrival=NAME's, and slo=NAME's. They need no device and no file
(harness/serving/trace.py reads a trace; harness/front/resolve.py describe_trace, once the device is known).
"""

from __future__ import annotations

import math

from kvbench.harness.config import (
    ARRIVALS, DISTRIBUTIONS, RATE_ARRIVALS, THINK_DISTRIBUTIONS, TRACE_FORMATS, TRACE_SAMPLES, WORKLOAD_KINDS, Config,
)
from kvbench.harness.front.checks import check, choices, one_of


def validate_workload(cfg: Config) -> None:
    """workload.*: its distribution, its kind's keys first (a multi_turn run's num_requests comes from its users
    and turns), the lengths, then the keys of a file the requests come from."""
    w = cfg.workload
    one_of("workload.distribution", w.distribution, DISTRIBUTIONS)
    validate_reuse_keys(cfg)
    check(w.num_requests is None or w.num_requests >= 1,  # None: a trace's every row (describe_trace)
          f"workload.num_requests={w.num_requests} must be >= 1")
    check(w.prompt_len >= 1, f"workload.prompt_len={w.prompt_len} must be >= 1")
    check(w.output_len >= 1, f"workload.output_len={w.output_len} must be >= 1")
    check(w.n >= 1, f"workload.n={w.n} must be >= 1")
    check(0 <= w.shared_prefix_len < cfg.max_seq_len,
          f"workload.shared_prefix_len={w.shared_prefix_len} must be in [0, max_seq_len={cfg.max_seq_len})")
    check(w.sigma > 0, f"workload.sigma={w.sigma} must be > 0")
    check(0 <= w.spread < 1, f"workload.spread={w.spread} must be in [0, 1)")
    check(w.output_spread is None or 0 <= w.output_spread < 1,
          f"workload.output_spread={w.output_spread} must be in [0, 1), or null (the prompts' spread)")
    if w.distribution == "fixed":
        check(float(w.prompt_len).is_integer() and float(w.output_len).is_integer(),
              f"workload.prompt_len={w.prompt_len:g} and workload.output_len={w.output_len:g} "
              "must be whole numbers for workload.distribution=fixed")
        total = w.prompt_len + w.output_len
        check(total <= cfg.max_seq_len,
              f"a request of workload.prompt_len + workload.output_len = {total:g} tokens "
              f"is longer than max_seq_len={cfg.max_seq_len}")
    validate_trace_keys(cfg)


def validate_trace_keys(cfg: Config) -> None:
    """The workload=trace keys that need no file; harness/serving/trace.py checks the file itself."""
    w = cfg.workload
    one_of("workload.sample", w.sample, TRACE_SAMPLES)
    if w.distribution == "trace":
        check(bool(w.path), "workload.path must name a CSV, JSONL or parquet file for workload=trace "
                            "(workload.distribution=trace)")
    elif w.distribution == "text":
        check(bool(w.path), "workload.path must name a local text file for workload=text (workload.distribution=text)")
        check(bool(cfg.model.path), "workload=text tokenizes the file with the checkpoint's own tokenizer: set "
                                    "model.path=DIR (a Hugging Face checkpoint folder with tokenizer.json)")
        check(cfg.scenario.name == "decode", f"workload=text runs in scenario=decode (its perplexity and teacher-"
                                             f"forced accuracy need a model), not scenario={cfg.scenario.name}")
        check(w.kind == "plain" and w.n == 1 and w.shared_prefix_len == 0,
              "workload=text takes its prompts from the text: leave workload.kind, workload.n and "
              "workload.shared_prefix_len at their defaults")
    else:
        check(w.path is None, f"workload.path={w.path!r} is read only by workload=trace or workload=text "
                              f"(workload.distribution=trace|text), not workload.distribution={w.distribution}")


CLOSED_LOOP_SCENARIOS = ("decode", "capacity")  # the scenarios whose runs take a request source


def validate_reuse_keys(cfg: Config) -> None:
    """workload.kind and its keys (harness/serving/conversations.py, system_prompts.py), and
    workload.format (harness/serving/trace.py)."""
    w = cfg.workload
    one_of("workload.kind", w.kind, WORKLOAD_KINDS)
    one_of("workload.format", w.format, TRACE_FORMATS)
    one_of("workload.think_distribution", w.think_distribution, THINK_DISTRIBUTIONS)
    check(w.users >= 1, f"workload.users={w.users} must be >= 1")
    check(w.turns >= 1, f"workload.turns={w.turns} must be >= 1")
    check(math.isfinite(w.think_time_s) and w.think_time_s >= 0,
          f"workload.think_time_s={w.think_time_s} must be >= 0 seconds")
    check(w.system_prompts >= 1, f"workload.system_prompts={w.system_prompts} must be >= 1")
    check(math.isfinite(w.zipf_exponent) and w.zipf_exponent >= 0,
          f"workload.zipf_exponent={w.zipf_exponent} must be >= 0 (0: every system prompt equally popular)")
    check(w.hash_block_size >= 1, f"workload.hash_block_size={w.hash_block_size} must be >= 1 token")
    if w.format == "mooncake":
        check(w.distribution == "trace", f"workload.format=mooncake is a trace file's format: it needs "
                                         f"workload.distribution=trace (workload=mooncake), not {w.distribution}")
        check(w.shared_prefix_len == 0, f"workload.shared_prefix_len={w.shared_prefix_len}: workload.format=mooncake "
                                        "takes every prompt token from the trace's hash_ids")
    if w.kind == "plain":
        return
    check(w.distribution != "trace", f"workload.kind={w.kind} draws its own prompts; "
                                     "workload.distribution=trace is for workload.kind=plain")
    check(w.shared_prefix_len == 0, f"workload.shared_prefix_len={w.shared_prefix_len} is for workload.kind=plain; "
                                    f"workload.kind={w.kind} shares its own prefixes")
    if w.kind == "system_prompt":
        check(1 <= w.system_prompt_len <= cfg.max_seq_len - 2,
              f"workload.system_prompt_len={w.system_prompt_len} must be in [1, max_seq_len - 2 = "
              f"{cfg.max_seq_len - 2}] (a user token and an output token must fit after it)")
        return
    # multi_turn: a closed loop, which the decode and capacity scenarios run (both clocks)
    check(w.n == 1, f"workload.n={w.n}: workload.kind=multi_turn has one answer per turn (n=1)")
    check(w.num_requests == w.users * w.turns,
          f"workload.num_requests={w.num_requests} must equal workload.users x workload.turns = "
          f"{w.users * w.turns} for workload.kind=multi_turn (leave it unset)")
    check(cfg.scenario.name in CLOSED_LOOP_SCENARIOS,
          f"workload.kind=multi_turn (closed-loop arrivals) runs in scenario={'|'.join(CLOSED_LOOP_SCENARIOS)}, "
          f"not scenario={cfg.scenario.name}")
    check(cfg.arrival.name != "trace", "arrival=trace needs a trace file; workload.kind=multi_turn times its "
                                       "first turns by burst, poisson, gamma or constant arrivals")


def validate_arrival(cfg: Config) -> None:
    a = cfg.arrival
    one_of("arrival.name", a.name, ARRIVALS)
    check(a.rate is None or (math.isfinite(a.rate) and a.rate > 0),
          f"arrival.rate={a.rate} must be > 0 requests per second")
    check(a.name not in RATE_ARRIVALS or a.rate is not None,
          f"arrival={a.name} needs arrival.rate (requests per second, > 0)")
    check(math.isfinite(a.burstiness) and a.burstiness > 0,
          f"arrival.burstiness={a.burstiness} must be > 0 (1 is Poisson, smaller is burstier)")
    check(math.isfinite(a.time_scale) and a.time_scale > 0, f"arrival.time_scale={a.time_scale} must be > 0")
    if a.max_concurrency is not None:
        check(isinstance(a.max_concurrency, int) and not isinstance(a.max_concurrency, bool) and a.max_concurrency >= 1,
              f"arrival.max_concurrency={a.max_concurrency} must be a whole number >= 1 (a client's requests in "
              "flight, as vllm bench serve --max-concurrency), or null for no cap")
        check(cfg.scenario.name in CLOSED_LOOP_SCENARIOS,
              f"arrival.max_concurrency (a closed loop) runs in scenario={'|'.join(CLOSED_LOOP_SCENARIOS)}, "
              f"not scenario={cfg.scenario.name}")
        check(cfg.workload.kind != "multi_turn", "arrival.max_concurrency and workload.kind=multi_turn are two closed "
                                                 "loops: a conversation's users are its clients (leave the cap null)")
    check(a.name != "trace" or cfg.workload.distribution == "trace",
          f"arrival=trace needs arrival times from a file (workload=trace with a workload.columns.arrival_s "
          f"column); workload={cfg.workload.name} has none")



def slo_set(cfg: Config) -> bool:
    return any(getattr(cfg.slo, k) is not None for k in ("ttft_ms", "tpot_ms", "e2el_ms", "normalized_latency_s"))


def validate_slo(cfg: Config) -> None:
    slo = cfg.slo
    check(0 < slo.percentile <= 100, f"slo.percentile={slo.percentile} must be in (0, 100]")
    for key in ("ttft_ms", "tpot_ms", "e2el_ms", "normalized_latency_s"):
        value = getattr(slo, key)
        check(value is None or value > 0, f"slo.{key}={value} must be > 0 (or null: not checked)")
    if cfg.scenario.bookkeeping and cfg.gpu is None and cfg.clock_profile is None:
        check(cfg.arrival.name == "burst" and not slo_set(cfg),
              f"arrival={cfg.arrival.name} and slo={cfg.slo.name} need a clock: the bookkeeping runs "
              f"(scenario=capacity, scenario.probe=capacity) take the simulated one from gpu=NAME "
              f"({', '.join(choices('gpu'))}) or from a measured profile, clock_profile=RUN_DIR "
              "(scenario=profile makes one)")
    if cfg.scenario.name != "max_rate":
        return
    check(slo_set(cfg),
          "scenario=max_rate needs an SLO with a limit: slo=NAME (" + ", ".join(choices("slo")) +
          ") or slo.ttft_ms / slo.tpot_ms / slo.e2el_ms / slo.normalized_latency_s")
    one_of("arrival.name (scenario=max_rate searches over arrival.rate)", cfg.arrival.name, RATE_ARRIVALS)
    sc = cfg.scenario
    check(sc.start_rps > 0, f"scenario.start_rps={sc.start_rps} must be > 0")
    check(sc.tolerance_rps > 0, f"scenario.tolerance_rps={sc.tolerance_rps} must be > 0")
    check(sc.search_limit >= sc.start_rps,
          f"scenario.search_limit={sc.search_limit} must be >= scenario.start_rps={sc.start_rps}")

