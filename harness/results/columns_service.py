"""The declarations of a row's service, profile, accuracy, kernel and contention metrics, in the rows' order."""

from __future__ import annotations

from kvbench.harness.results.column import Column as C, group

_M = "metric"

# Per-request latencies (vLLM's definitions; a request with n samples is one request): family -> what it times.
LATENCIES = {
    "ttft": "time to first token: first token - arrival",
    "tpot": "time per output token: (E2EL - TTFT) / (output tokens - 1)",
    "itl": "inter-token latency: every gap between a sequence's tokens",
    "e2el": "end-to-end latency: finish - arrival",
    "queue": "queueing: admitted - arrival",
}
STATS = {"mean": "mean", "p50": "median", "p90": "90th percentile", "p99": "99th percentile"}
KEY_LATENCIES = ("ttft_ms_p50", "tpot_ms_p50")  # what a reader of a service run asks first

SERVICE_COLUMNS = [
    *group(
        _M, "service",
        C("arrival", "str", None, "the arrival process (burst, poisson, gamma, trace, ...)"),
        C("request_rate", "float", "req/s", "the rate offered: the configured one, a trace's own; empty for a "
          "burst"),
        C("achieved_rps", "float", "req/s", "requests served over duration_s"),
        C("duration_s", "float", "s", "the run's duration on the row's clock (wall or simulated)"),
        C("idle_s", "float", "s", "time with nothing arrived and nothing running"),
        C("clock", "str", None, "wall (measured) or simulated (priced by clock_source)"),
        C("gpu", "str", None, "a simulated clock's GPU: <count>x <name> (conf/gpu/)"),
        C("slo", "str", None, "the service-level objective the row was judged by"),
        C("clock_source", "str", None, "a simulated clock's prices: a profile's id (scenario=profile), or "
          "roofline-v<N> (harness/serving/cost_model.py)"),
        *[C(f"{fam}_ms_{stat}", "float", "ms", f"{what}, {STATS[stat]} over requests (vLLM's "
          f"definitions; a request with n samples is one request)", key=f"{fam}_ms_{stat}" in
            KEY_LATENCIES) for fam, what in LATENCIES.items() for stat in STATS],
        C("normalized_latency_s", "float", "s", "the mean of E2EL / output tokens (the paper's s/token)"),
        C("goodput_rps", "float", "req/s", "requests meeting every set SLO per second (DistServe's definition)"),
        C("slo_attainment", "float", "fraction", "requests meeting every set SLO over requests offered"),
        C("slo_pass", "bool", None, "whether the run passed its SLO: each latency's chosen percentile within its "
          "limit and the mean normalized latency within its bound (the paper's criterion), every request served"),
    ),
    *group(
        _M, "profile",
        C("attention_share_decode", "float", "fraction", "scenario=profile: the median share of a decode step spent "
          "in the cache's attention, its K/V writes and kernel, timed inside the real steps (the profile table has "
          "attention_seconds, attention_share per point)"),
        C("attention_share_prefill", "float", "fraction", "scenario=profile: the same for a prefill step"),
        C("attention_share_decode_top", "float", "fraction", "scenario=profile: attention_share_decode at the "
          "largest batch x context"),
        C("profile_drift", "float", "fraction", "scenario=profile with scenario.wall: re-timed points over first "
          "timed ones, less 1, at the job's end"),
        C("machine_pace", "float", "ratio", "scenario=profile with scenario.wall on a CPU: the machine's pace in a wall "
          "run (or the wall search) against its pace while the profile was measured: one fixed unit of work timed in "
          "the serving thread during each, the median over the run's units of each over the profile's after a step of "
          "the same batch (harness/measure/pace_meter.py; 1.2: 1.2x as long); on a "
          "simulated row, the pace its prices were scaled by (the row of the same rate without it: the profile's own)"),
    ),
    *group(
        _M, "KV data type accuracy",
        C("kv_top1_agreement", "float", "fraction", "at a quantized kv_dtype (harness/serving/kv_accuracy.py), "
          "teacher-forced on the full-precision run's tokens, or on the text with workload=text: the share of "
          "positions whose most likely token is the same as at kv_dtype=auto"),
        C("kv_kl_mean", "float", "nats", "the same positions' mean KL(auto || quantized)"),
        C("kv_greedy_agreement", "float", "fraction", "the timed run's greedy tokens against the same requests at "
          "kv_dtype=auto, up to each request's first divergence"),
        C("kv_perplexity", "float", None, "workload=text: the perplexity of the text through the cache"),
        C("kv_ref_perplexity", "float", None, "workload=text: the same at kv_dtype=auto"),
        C("kv_accuracy_positions", "int", None, "the positions the agreement and KL are over"),
        C("kv_accuracy_gate", "str", None, "pass when kv_top1_agreement is at least 99% (MLPerf's way)"),
        C("kv_accuracy_rule", "str", None, "the rule the gate applied, in words"),
        C("kv_accuracy_weights", "str", None, "dummy or checkpoint: on dummy weights the notes say the figures are "
          "how far rounding moves random logits, not what a trained model loses"),
    ),
    *group(
        _M, "searches",
        C("max_rate_rps", "float", "req/s", "scenario=max_rate (and profile, wall_check): the highest rate "
          "whose run passed the SLO (searched down to scenario.tolerance_rps)"),
        C("probes", "int", None, "the runs a search made (max_rate, max_concurrency; profile: its "
          "points)"),
    ),
    *group(
        _M, "kernel scenario",
        C("layout", "str", None, "scenario=kernel (one point per job; batch and block_size are the point's): the "
          "K/V layout timed (paged, contiguous)"),
        C("kernel_batch", "int", None, "the point's batch"),
        C("context_len", "int", "tokens", "the point's context length"),
        C("num_heads", "int", None, "the model's query heads"),
        C("num_kv_heads", "int", None, "the model's K/V heads"),
        C("head_dim", "int", None, "the model's head size"),
        C("latency_us_p50", "float", "us", "a kernel call's time, median"),
        C("latency_us_p10", "float", "us", "a kernel call's time, 10th percentile"),
        C("latency_us_p90", "float", "us", "a kernel call's time, 90th percentile"),
        C("bytes_moved", "int", "bytes", "the bytes a call must read and write"),
        C("bandwidth_gbps", "float", "GB/s", "bytes_moved over latency_us_p50"),
        C("copy_bw_gbps", "float", "GB/s", "the device's measured copy bandwidth"),
        C("peak_bw_gbps", "float", "GB/s", "the device's peak memory bandwidth"),
        C("frac_copy_bw", "float", "fraction", "bandwidth_gbps over copy_bw_gbps"),
        C("frac_peak_bw", "float", "fraction", "bandwidth_gbps over peak_bw_gbps"),
        C("max_abs_err", "float", None, "the largest absolute difference from the torch reference's output"),
        C("max_rel_err", "float", None, "max_abs_err over the reference output's largest magnitude"),
        C("kv_quant_max_abs_err", "float", None, "a quantized cache: the reference over the quantized cache "
          "against the reference over the float K/V"),
        C("sm_clock_mhz", "int", "MHz", "on a GPU: NVML's SM clock right after the point's timed calls"),
        C("clock_throttle_reasons", "str", None, "on a GPU: NVML's clock throttle reasons right after the point's "
          "timed calls"),
    ),
    *group(
        _M, "contention",
        C("cpu_util", "float", None, "CPU runs (harness/measure/contention.py): process CPU seconds over the busy "
          "wall seconds: 2.0 is two cores throughout; waits for arrivals left out"),
        C("run_queue_wait_frac", "float", "fraction", "how long the process's threads waited, ready, for a free "
          "core (/proc/self/task/*/schedstat)"),
        C("load_avg_before", "float", None, "the 1-minute load average before the run"),
        C("load_avg_after", "float", None, "the 1-minute load average after the run"),
        C("steal_frac", "float", "fraction", "CPU time stolen by the hypervisor, where /proc/stat reports steal"),
        C("others_cpu", "float", None, "the cores' worth of CPU the rest of the machine used meanwhile: /proc/stat's "
          "busy time less the process's own"),
        C("contended", "bool", None, "its threads waited for a core more than 25% of the time, or a busy process's "
          "threads and the others together asked for more than 1.25x the cores, or steal passed 5% (said in notes; "
          "one co-runner beside a one-thread job on two cores is recorded in others_cpu but not flagged)"),
    ),
]
