"""The declarations of a row's throughput, step, token, concurrency, KV and memory metrics, in the rows' order."""

from __future__ import annotations

from kvbench.harness.results.column import Column as C, group

_M = "metric"

RUN_COLUMNS = [
    *group(
        _M, "throughput and steps",
        C("wall_s", "float", "s", "the run's wall time (decode: the median over repeats; capacity: the simulation's)"),
        C("tokens_per_s", "float", "tok/s", "prompt and output tokens over the run's duration (decode: the median "
          "over repeats; on a simulated clock over its duration)", key=True),
        C("tokens_per_s_spread", "float", "tok/s", "decode: how far the repeats' tokens_per_s spread"),
        C("output_tokens_per_s", "float", "tok/s", "output tokens over the run's duration", key=True),
        C("requests_per_s", "float", "req/s", "decode: requests over the wall time"),
        C("step_ms_p50", "float", "ms", "decode: a decode step's wall time, median", key=True),
        C("step_ms_p90", "float", "ms", "decode: a decode step's wall time, 90th percentile"),
        C("step_ms_p99", "float", "ms", "decode: a decode step's wall time, 99th percentile"),
        C("prefill_step_ms_p50", "float", "ms", "decode: a prefill step's wall time, median (prefill steps apart "
          "from decode steps: a change such as kv_dtype's quantizing writes may move them in opposite directions)"),
        C("prefill_step_ms_p90", "float", "ms", "decode: a prefill step's wall time, 90th percentile"),
        C("prefill_steps", "int", None, "decode: prefill steps, apart from the decode steps of step_ms_*"),
        C("host_ms_p50", "float", "ms", "decode: a step's host time until its forward is enqueued, before any "
          "sync, median: near step_ms means the step is bound by the host on a GPU; on a CPU the forward runs as "
          "it is enqueued, so it is the step less the work after its forward, 0.06-0.6 ms at tiny-llama and the "
          "58M model, most of it the logits' argmax"),
        C("host_ms_p90", "float", "ms", "decode: a step's host time until its forward is enqueued, 90th "
          "percentile"),
        C("piecewise_steps", "int", None, "decode: steps run as graph pieces (CUDA graph replays when cuda_graph)",
          extra=True),
    ),
    *group(
        _M, "CPU decode mode",
        C("cpu_compile", "bool", None, "CPU decode, max_rate and max_concurrency rows: whether the dense work ran "
          "compiled (harness/model/compiled.py)"),
        C("compile_s", "float", "s", "the compile's time, outside every timed region (cpu_compile)"),
        C("linear_backend", "str", None, "CPU decode rows: which GEMMs the eager dense work ran (kvbench's or "
          "oneDNN's on packed weights, or torch's F.linear)"),
        C("elementwise_backend", "str", None, "CPU decode rows: the element-wise ops the dense work ran (fused_cpp: "
          "kernels/dense_op.py, or torch)"),
    ),
    *group(
        _M, "tokens and reuse",
        C("decode_steps", "int", None, "decode steps, counted as the decode engine counts them (capacity: a "
          "simulated jump of k steps counts k)"),
        C("output_tokens", "int", "tokens", "tokens generated (empty when a capacity run rejected requests)"),
        C("prompt_tokens", "int", "tokens", "prompt tokens of the workload"),
        C("prefill_tokens", "int", "tokens", "decode: tokens actually computed in prefills (cache hits excluded)"),
        C("cache_hit_tokens", "int", "tokens", "prompt tokens served from the prefix cache"),
        C("prefix_hit_rate", "float", "fraction", "prompt tokens served from the prefix cache, the device's or the "
          "host tier's, at each request's first admission, over every prompt token of the workload (as in vLLM, a "
          "prompt's last token is always computed); both clocks, also over time in the steps table"),
        C("prefix_hit_rate_ideal", "float", "fraction", "prefix_hit_rate with an unbounded cache, from the "
          "workload alone"),
        C("evicted_blocks", "int", None, "cached blocks evicted from the prefix cache"),
        C("recomputed_tokens", "int", "tokens", "tokens computed again when a preempted sequence was re-admitted"),
        C("host_hit_tokens", "int", "tokens", "host tier (device.host_kv_gb): prompt tokens served from it"),
        C("host_stored_blocks", "int", None, "host tier: blocks copied to the host"),
        C("host_loaded_blocks", "int", None, "host tier: blocks copied back to the device"),
        C("swapped_out", "int", None, "preemption=swap: sequences swapped out to the host tier"),
    ),
    *group(
        _M, "concurrency",
        C("peak_concurrency", "int", None, "the most sequences running at once"),
        C("max_concurrency", "int", None, "measured: peak resident sequences before any preemption; the "
          "max_concurrency scenario's search result", key=True),
        C("max_concurrency_analytic", "int", None, "vLLM's formula: KV capacity / blocks per request; contiguous: "
          "budget / (max_seq_len x KV bytes per token)"),
        C("preemptions", "int", None, "sequences preempted"),
        C("rejected", "int", None, "requests that can never fit and were rejected"),
    ),
    *group(
        _M, "KV accounting",
        C("kv_bytes_per_token", "int", "bytes", "what one token keeps over the layers that keep tokens: 2 x layers "
          "x kv_heads x head_dim x dtype bytes, or an MLA model's layers x (kv_lora_rank + qk_rope_head_dim) x dtype "
          "bytes (its latent, as every engine caches it); a quantized kv_dtype counts one byte an element and, at "
          "kv_scale=token_head, the scales; a linear-attention layer keeps no token (state_bytes_per_seq)"),
        C("kv_groups", "str", None, "each KV-cache group's attention kind and layer count, e.g. "
          "full:10,sliding1024:52"),
        C("state_bytes_per_seq", "int", "bytes", "capacity: the fixed state one sequence keeps whatever its length: "
          "linear-attention layers x (recurrent state num_v_heads x key_dim x value_dim + convolution state "
          "(conv_kernel - 1) x conv channels) x dtype bytes (Qwen3-Next); 0 for a model without one. Its pool "
          "holds it in whole pages (kv_bytes_reserved counts the padding)"),
        C("kv_bytes_per_token_mha", "int", "bytes", "capacity, MLA models: the same model cached as ordinary "
          "attention, layers x heads x (qk_nope + qk_rope + v_head_dim) x dtype bytes: a comparison figure"),
        C("max_concurrency_mha_analytic", "int", None, "capacity, MLA models: max_concurrency_analytic with "
          "kv_bytes_per_token_mha instead (the same budget, the model cached as ordinary attention)"),
        C("kv_pool_bytes", "int", "bytes", "the KV pool's size"),
        C("kv_bytes_reserved", "int", "bytes", "KV memory reserved, peak over the run", key=True),
        C("kv_bytes_used", "int", "bytes", "KV memory holding real token states, peak over the run", key=True),
        C("kv_bytes_logical", "int", "bytes", "the tokens' KV bytes summed over sequences (what storage "
          "without sharing needs), at the moment of peak token states"),
        C("kv_fragmentation_bytes", "int", "bytes", "paged: unfilled slots of held blocks (partly filled last "
          "blocks), at the moment of peak token states"),
        C("kv_reservation_waste_bytes", "int", "bytes", "contiguous: reserved slots not (yet) written, at the "
          "moment of peak token states"),
        C("kv_external_fragmentation_bytes", "int", "bytes", "Orca Pow2/Oracle: free KV memory in holes too small "
          "for the request that waits first"),
        C("kv_used_fraction", "float", "fraction", "the share of the held KV memory that holds real token states "
          "(the paper's vLLM: 96.3%), at the moment of peak token states", key=True),
        C("sharing_savings", "float", "fraction", "1 - used / logical tokens: what sharing (parallel samples, "
          "prefixes) saved, at the moment of peak token states"),
        C("weight_bytes", "int", "bytes", "the model's weights", key=True),
        C("budget_kv_bytes", "int", "bytes", "the KV cache's memory budget", key=True),
        C("budget_device_bytes", "int", "bytes", "the device memory the budget was taken from"),
        C("budget_source", "str", None, "where budget_device_bytes came from (device.memory_gb, or the "
          "device's total)"),
        C("budget_graph_bytes", "int", "bytes", "decode: the decode CUDA graphs' memory, charged before the KV "
          "cache", extra=True),
    ),
    *group(
        _M, "memory measured",
        C("nvml_used_bytes", "int", "bytes", "NVML's device memory used, peak (NVML finds the GPU by torch's "
          "device UUID, sampled every 25 ms)"),
        C("nvml_process_bytes", "int", "bytes", "NVML's memory of this process, peak"),
        C("nvml_baseline_bytes", "int", "bytes", "NVML's device memory used before the run"),
        C("torch_allocated_bytes", "int", "bytes", "torch's allocated memory, peak"),
        C("torch_reserved_bytes", "int", "bytes", "torch's reserved memory, peak"),
        C("rss_bytes", "int", "bytes", "the process's resident memory, peak"),
        C("energy_j", "float", "J", "NVML's board energy counter over the run (GPU only)"),
        C("avg_power_w", "float", "W", "energy_j over the run's time (GPU only)"),
        C("energy_per_output_token_j", "float", "J", "energy_j per output token (GPU only)"),
    ),
    *group(
        _M, "tokens generated",
        C("output_digest", "str", None, "a hash of every generated token: in fp32 the impls must give the same "
          "digest (the report's parity check is exact there); in bf16/fp16 tied logits may round apart, and the "
          "report gives the prefix agreement instead: per request, the tokens equal up to its first divergence, "
          "over the reference impl's (contiguous's) tokens"),
        C("kv_gather_steps", "int", None, "contiguous: decode steps whose sequences were not in adjacent lanes, so "
          "K/V were copied out of the slab before SDPA"),
    ),
]
