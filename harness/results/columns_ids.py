"""The declarations of a row's identifiers, fingerprint and status columns, in the rows' order."""

from __future__ import annotations

from kvbench.harness.results.column import Column as C, group

IDENTIFIER_COLUMNS = [
    *group(
        "identifier", "what was run",
        C("run_id", "str", None, "the run folder relative to the working directory (unique across sweeps), else its "
          "path; the report's all_runs names each folder once as run_dir, the same path"),
        C("scenario", "str", None, "the scenario: decode, capacity, kernel, profile, max_rate, max_concurrency",
          key=True),
        C("impl", "str", None, "the KV-cache impl (conf/impl/); another system's imported results: <system>, with "
          "source=external", key=True),
        C("cache", "str", None, "the impl's cache kind (contiguous, paged, ...)"),
        C("kernel", "str", None, "the attention kernel the impl asks for"),
        C("kernel_backend", "str", None, "what really ran: cuda (the op's CUDA kernel), cpp-cpu (the same op's C++ "
          "kernel on CPU), triton, triton-interpreter (CPU), torch (gather reference), sdpa (torch SDPA, "
          "contiguous), flex-compiled / flex-eager (torch FlexAttention compiled, or its eager math path on CPU); "
          "no CPU row reads as a GPU figure"),
        C("eviction", "str", None, "the prefix cache's eviction policy (paged rows with prefix caching)"),
        C("host_kv_gb", "float", "GB", "the host tier's size, device.host_kv_gb (paged rows)"),
        C("preemption", "str", None, "what preemption does (paged rows): recompute, or swap to the host tier"),
        C("host_copy", "str", None, "how a simulated clock priced the host tier's copies (paged rows with a host "
          "tier, on a simulated clock)"),
        C("model", "str", None, "the model (conf/model/)", key=True),
        C("dtype", "str", None, "the model's data type", key=True),
        C("kv_dtype", "str", None, "the KV cache's data type; auto: the model's", key=True),
        C("kv_scale", "str", None, "how a quantized cache's scales are kept (at a quantized kv_dtype; "
          "token_head: one per token and head, counted in kv_bytes_per_token)"),
        C("kv_manager", "str", None, "how the KV cache treats layers of different attention kinds: uniform, hybrid, "
          "split_pools"),
        C("block_size", "int", "tokens", "tokens per KV block (kernel rows: the point's)"),
        C("batch", "int", None, "the most sequences a step runs (max_num_seqs); kernel rows: the point's batch",
          key=True),
        C("chunked_prefill", "bool", None, "whether a step may compute prompt chunks beside the decodes "
          "(harness/serving/scheduler.py); empty on kernel rows", typed=False),
        C("max_num_batched_tokens", "int", "tokens", "the most tokens a step computes (empty on kernel rows)",
          typed=False),
        C("max_seq_len", "int", "tokens", "the longest sequence, prompt and output"),
        C("workload", "str", None, "the workload (conf/workload/)", key=True),
        C("num_requests", "int", None, "requests in the workload"),
        C("prompt_len", "int", "tokens", "the workload's prompt length (a drawn distribution's mean)"),
        C("output_len", "int", "tokens", "the workload's output length (a drawn distribution's mean)"),
        C("shared_prefix_len", "int", "tokens", "tokens every prompt shares at its start"),
        C("n", "int", None, "parallel samples per request"),
        C("seed", "int", None, "the seed the workload is drawn from"),
        C("repeat", "int", None, "timed repeats of the run (decode: the timing columns are over them)"),
        C("cpu_threads", "int", None, "the intra-op threads a CPU job ran on; a bookkeeping job, which runs nothing "
          "on threads, records the configured value, empty by default, and does not sample the machine's load "
          "for it"),
        C("cuda_graph", "bool", None, "whether decode steps may run as CUDA graphs (piecewise_steps: how many did)",
          extra=True),
        C("workload_digest", "str", None, "a hash of the drawn workload (its requests and arrivals)"),
        C("trace_sha256", "str", None, "the trace file's SHA-256 (workload=trace)"),
        C("job_id", "str", None, "the job's identity (harness/job/identity.py): what resume=true matches a "
          "folder's rows by"),
        C("replay_of", "str", None, "a replay (harness/front/replay.py): the run folder this row re-ran"),
    ),
]

FINGERPRINT_COLUMNS = [
    *group(
        "fingerprint", "the machine and the code",
        C("device", "str", None, "where the run computed: cpu or cuda"),
        C("device_slug", "str", None, "the machine's model, the folder published results live under "
          "(results/<device-slug>/): the GPU's name (and count, -x8, when more than one), or the CPU's model and "
          "core count (cpu-intel-xeon-2core)", key=True),
        C("gpu_name", "str", None, "the GPU's name"),
        C("gpu_count", "int", None, "GPUs visible"),
        C("gpu_memory_bytes", "int", "bytes", "the GPU's memory"),
        C("driver_version", "str", None, "the NVIDIA driver's version"),
        C("cuda_version", "str", None, "the CUDA version torch was built with"),
        C("cpu_name", "str", None, "the CPU's model name"),
        C("cpu_count", "int", None, "the CPU cores"),
        C("torch_version", "str", None, "torch's version"),
        C("triton_version", "str", None, "Triton's version"),
        C("python_version", "str", None, "Python's version"),
        C("git_sha", "str", None, "the commit of the code that ran"),
        C("git_dirty", "bool", None, "whether the checkout differed from that commit (untracked files too; "
          "results/ does not count)"),
        C("hostname_hash", "str", None, "a hash of the host's name: which rows share a machine, without naming it"),
        C("measured_at", "str", None, "when the row was measured: UTC, ISO 8601 to the second (a resumed or kept "
          "row keeps its own)"),
        C("fingerprint_diff", "str", None, "a replay: the fingerprint fields that differ from the original run's"),
    ),
]

STATUS_COLUMNS = [
    *group(
        "status", "status",
        C("status", "str", None, "ok, oom (out of memory), error, skipped (not applicable), interrupted (stopped "
          "by a signal)", key=True),
        C("error", "str", None, "why the row is not ok, in one line"),
        C("notes", "str", None, "what a reader must know about an ok row (e.g. why NVML columns are empty, "
          "contention, rejected requests), joined by |"),
    ),
]
