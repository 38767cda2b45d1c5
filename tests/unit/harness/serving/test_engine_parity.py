"""End to end: every impl generates exactly the same greedy tokens as the contiguous cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvbench.harness.front.job import run_job

SMALL = ["model=tiny-llama", "dtype=float32", "max_seq_len=128", "scenario.warmup=0", "device=cpu"]


def run(compose, tmp_path: Path, impl: str, overrides: list[str]) -> tuple[dict, list[dict]]:
    out = tmp_path / impl
    rows, code = run_job(compose([f"+impl={impl}", *SMALL, *overrides]), out)
    assert code == 0, rows[0].get("error")
    (row,) = rows
    tokens = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    for t in tokens:
        t.pop("impl")
    return row, tokens


def assert_same(compose, tmp_path, overrides, impls=("paged_torch",)):
    ref_row, ref_tokens = run(compose, tmp_path, "contiguous", overrides)
    assert ref_row["status"] == "ok"
    rows = {}
    for impl in impls:
        row, tokens = run(compose, tmp_path, impl, overrides)
        assert row["output_digest"] == ref_row["output_digest"], impl
        assert tokens == ref_tokens, impl
        rows[impl] = row
    return ref_row, rows


@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
def test_unaligned_lengths(compose, tmp_path, block_size):
    """Every impl that runs at speed on CPU (paged_cuda on its C++ kernel) against contiguous."""
    assert_same(compose, tmp_path, [f"block_size={block_size}", "batch=4", "workload=uniform",
                                    "workload.num_requests=6", "workload.prompt_len=37", "workload.output_len=11"],
                impls=("paged_torch", "paged_cuda"))


def test_triton_in_the_interpreter_agrees(compose, tmp_path):
    """One small paged_triton case (the Triton interpreter is slow on CPU)."""
    assert_same(compose, tmp_path, ["block_size=8", "batch=2", "workload=uniform", "workload.num_requests=3",
                                    "workload.prompt_len=13", "workload.output_len=4"], impls=("paged_triton",))


def test_shared_prefix_hits_cache(compose, tmp_path):
    ref, rows = assert_same(compose, tmp_path, ["batch=3", "workload=shared_prefix", "workload.num_requests=5",
                                                "workload.prompt_len=50", "workload.shared_prefix_len=40",
                                                "workload.output_len=6"])
    paged = rows["paged_torch"]
    assert paged["cache_hit_tokens"] > 0 and paged["prefill_tokens"] < ref["prefill_tokens"]


def test_parallel_sampling_shares_and_diverges(compose, tmp_path):
    ref, rows = assert_same(compose, tmp_path, ["batch=6", "workload=parallel_sampling", "workload.n=3",
                                                "workload.num_requests=2", "workload.prompt_len=21",
                                                "workload.output_len=9"])
    lines = (tmp_path / "contiguous" / "tokens.jsonl").read_text().splitlines()
    outs = [json.loads(line)["output_ids"] for line in lines]
    assert len(outs) == 6 and outs[0] != outs[1]  # samples diverge (k-th ranked first token)
    assert rows["paged_torch"]["kv_bytes_used"] < ref["kv_bytes_used"]  # the prompt is stored once


def test_preemption_under_a_small_pool(compose, tmp_path):
    # 0.0012 GB = 18 blocks of 16 tokens at 4 KiB/token: too few for 6 concurrent requests.
    ref, rows = assert_same(compose, tmp_path, ["batch=6", "workload=fixed", "workload.num_requests=6",
                                                "workload.prompt_len=30", "workload.output_len=40",
                                                "device.kv_cache_gb=0.0012", "device.watermark=0"])
    assert rows["paged_torch"]["preemptions"] > 0


@pytest.mark.parametrize("overrides", [
    ["batch=6", "workload=parallel_sampling", "workload.n=3", "workload.num_requests=2", "workload.prompt_len=21",
     "workload.output_len=9"],
    # 292 token slots of unaligned lengths: requests wait for a hole; contiguous has 2 lanes of 128
    ["batch=4", "workload=uniform", "workload.num_requests=6", "workload.prompt_len=37", "workload.output_len=12",
     "device.kv_cache_gb=0.0012"],
], ids=["forks", "small-pool"])
def test_reservation_policies_generate_the_contiguous_tokens(compose, tmp_path, overrides):
    """Orca (Pow2) and Orca (Oracle) read K/V through a gather from variable-size regions."""
    ref, rows = assert_same(compose, tmp_path, overrides, impls=("orca_pow2", "orca_oracle"))
    for row in rows.values():
        assert row["kernel_backend"] == "sdpa+gather" and row["kv_gather_steps"] == row["decode_steps"] > 0
        assert row["kv_bytes_reserved"] <= ref["kv_bytes_reserved"]
        assert row["peak_concurrency"] >= ref["peak_concurrency"]
    assert rows["orca_oracle"]["kv_reservation_waste_bytes"] <= rows["orca_pow2"]["kv_reservation_waste_bytes"]


def test_every_impl_agrees_on_the_cpu_default_workload(compose, tmp_path):
    """No impl named: one row per impl on the CPU defaults (tiny-llama, chat workload, fp32)."""
    rows, code = run_job(compose(["scenario.warmup=0"]), tmp_path)
    assert code == 0, [r.get("error") for r in rows]
    assert [r["impl"] for r in rows] == ["contiguous", "orca_oracle", "orca_pow2", "paged_cuda", "paged_flex",
                                         "paged_torch", "paged_triton"]  # conf/impl/, sorted, aliases once
    assert all(r["status"] == "ok" and r["dtype"] == "float32" and r["model"] == "tiny-llama" for r in rows)
    assert len({r["output_digest"] for r in rows}) == 1
    by = {r["impl"]: r for r in rows}
    assert by["paged_torch"]["kv_bytes_reserved"] < by["contiguous"]["kv_bytes_reserved"]  # paging reserves less
    assert by["orca_oracle"]["kv_bytes_reserved"] < by["contiguous"]["kv_bytes_reserved"]  # so do exact regions


@pytest.mark.parametrize(("kv_dtype", "kv_scale"), [("fp8_e4m3", "tensor"), ("fp8_e5m2", "token_head"),
                                                    ("int8", "token_head"), ("int8", "tensor")])
def test_quantized_kv_every_impl_reads_the_same_cache(compose, tmp_path, kv_dtype, kv_scale):
    """At a quantized kv_dtype every impl that reads it quantizes and dequantizes alike (the paged pool,
    the slab, an Orca region; a prompt that shares a prefix, a static scale set by the first prefill):
    the same tokens as the contiguous cache; paged_cuda on its C++ kernel too."""
    ref, rows = assert_same(compose, tmp_path, [f"kv_dtype={kv_dtype}", f"kv_scale={kv_scale}", "block_size=8",
                                                "batch=4", "workload=uniform", "workload.num_requests=6",
                                                "workload.prompt_len=37", "workload.output_len=9"],
                            impls=("paged_torch", "orca_pow2", "paged_cuda"))
    assert rows["paged_cuda"]["kernel_backend"] == "cpp-cpu"
    per_token = 2 * 4 * 2 * (64 + (4 if kv_scale == "token_head" else 0))  # tiny-llama: 4 layers, 2 kv heads x 64
    assert ref["kv_bytes_per_token"] == rows["paged_torch"]["kv_bytes_per_token"] == per_token
    # prefill steps are timed apart from decode steps (6 prompts in batches of at most 4: >= 2 prefills)
    assert ref["prefill_steps"] >= 2 and ref["prefill_step_ms_p50"] > 0 and ref["step_ms_p50"] > 0


def test_a_kernel_module_refuses_a_quantized_cache_in_one_line(compose, tmp_path):
    """A kernel named by its module path takes no scales: float caches only, said in one line."""
    rows, code = run_job(compose(["+impl=paged_cuda", "impl.kernel=kernels.cuda_emulated", *SMALL,
                                  "kv_dtype=fp8_e4m3", "batch=2"]), tmp_path / "c")
    assert code == 0 and rows[0]["status"] == "skipped"
    assert rows[0]["error"] == "kernel kernels.cuda_emulated reads kv_dtype auto, not fp8_e4m3"
    # and the cache itself refuses, for a caller that builds one without a job
    from kvbench.impls.kinds import PoolSpec, TensorSpec, cache_kind
    from kvbench.kernels.validate import KernelArgumentError

    spec = PoolSpec(kv_bytes=1 << 20, bytes_per_token=1024, max_seq_len=64, block_size=16, max_num_seqs=2,
                    min_tokens=1, watermark=0.0, prefix_caching=False)
    tensors = TensorSpec(num_layers=1, num_heads=2, kv_heads=2, head_dim=64, dtype=torch.float32,
                         device=torch.device("cpu"), kv_dtype="int8")
    with pytest.raises(KernelArgumentError, match="kernel kernels.cuda_emulated reads kv_dtype auto, not int8"):
        cache_kind("paged").cache(spec, tensors, "kernels.cuda_emulated")


def test_a_host_tier_copies_evicted_blocks_back(compose, tmp_path):
    """The small pool above with a host tier: a preempted sequence's blocks, evicted to the host while
    it waits, come back by copy when it is admitted again, and the tokens are contiguous's."""
    small = ["batch=6", "workload=fixed", "workload.num_requests=6", "workload.prompt_len=30",
             "workload.output_len=40", "device.kv_cache_gb=0.0012", "device.watermark=0"]
    ref, rows = assert_same(compose, tmp_path, [*small, "device.host_kv_gb=0.001"], impls=("paged_torch", "paged_cuda"))
    for row in rows.values():
        assert row["preemptions"] > 0 and row["host_hit_tokens"] > 0 and row["host_loaded_blocks"] > 0
    without, _ = run(compose, tmp_path / "no-tier", "paged_torch", small)
    assert rows["paged_torch"]["prefill_tokens"] < without["prefill_tokens"]  # host hits are not recomputed


def test_preemption_by_swap(compose, tmp_path):
    """preemption=swap: victims' blocks go to the host tier and come back; the tokens are contiguous's."""
    small = ["batch=6", "workload=fixed", "workload.num_requests=6", "workload.prompt_len=30",
             "workload.output_len=40", "device.kv_cache_gb=0.0012", "device.watermark=0", "device.host_kv_gb=0.002"]
    ref, rows = assert_same(compose, tmp_path, [*small, "preemption=swap"], impls=("paged_torch", "paged_cuda"))
    for row in rows.values():
        assert row["preemptions"] > 0 and row["swapped_out"] > 0 and row["host_loaded_blocks"] > 0
        assert row["preemption"] == "swap"
    assert rows["paged_torch"]["prefill_tokens"] == 6 * 30  # nothing recomputed


def test_swap_needs_a_host_tier(compose, tmp_path):
    rows, code = run_job(compose(["+impl=paged_torch", *SMALL, "preemption=swap"]), tmp_path)
    assert code != 0 and "device.host_kv_gb" in rows[0]["error"]


def test_a_host_tier_and_swap_copy_a_quantized_cache_with_its_scales(compose, tmp_path):
    """kv_dtype=int8 with per-token scales: the tier copies the scales with the rows (block_stores)."""
    small = ["batch=6", "workload=fixed", "workload.num_requests=6", "workload.prompt_len=30",
             "workload.output_len=40", "device.watermark=0", "kv_dtype=int8", "kv_scale=token_head",
             # 1088 bytes a token (int8 rows and their fp32 scales): the pool above's 18 blocks of 16
             "device.kv_cache_gb=0.00032", "device.host_kv_gb=0.00056"]
    for preemption in ("recompute", "swap"):
        ref, rows = assert_same(compose, tmp_path / preemption, [*small, f"preemption={preemption}"])
        assert rows["paged_torch"]["preemptions"] > 0 and rows["paged_torch"]["host_loaded_blocks"] > 0


CHUNKED_CASES = {
    # prompts of 37 tokens in chunks of at most 16 - batch: every step after the first is mixed
    "chunks": ["block_size=8", "batch=4", "workload=uniform", "workload.num_requests=6", "workload.prompt_len=37",
               "workload.output_len=11"],
    # later prompts hit the blocks of a prefill still under way: they start at its computed frontier
    "shared_prefix": ["batch=3", "workload=shared_prefix", "workload.num_requests=5", "workload.prompt_len=50",
                      "workload.shared_prefix_len=40", "workload.output_len=6"],
    # the forks of a chunked prompt get their first tokens (and their copies) with its last chunk
    "parallel_sampling": ["batch=6", "workload=parallel_sampling", "workload.n=3", "workload.num_requests=2",
                          "workload.prompt_len=21", "workload.output_len=9"],
    # victims preempted while prefilling: recomputed, their unwritten blocks out of the prefix cache
    "preemption": ["batch=6", "workload=fixed", "workload.num_requests=6", "workload.prompt_len=30",
                   "workload.output_len=40", "device.kv_cache_gb=0.0012", "device.watermark=0"],
}


@pytest.mark.parametrize("case", sorted(CHUNKED_CASES))
def test_chunked_prefill_generates_the_unchunked_tokens(compose, tmp_path, case):
    """chunked_prefill=true (a 16-token step budget: prompts in chunks, mixed steps) gives every impl the
    tokens contiguous makes without it."""
    overrides = CHUNKED_CASES[case]
    _, ref_tokens = run(compose, tmp_path / "plain", "contiguous", overrides)
    chunked = [*overrides, "chunked_prefill=true", "max_num_batched_tokens=16"]
    for impl in ("contiguous", "paged_torch", "paged_cuda"):
        row, tokens = run(compose, tmp_path / "chunked", impl, chunked)
        assert tokens == ref_tokens, impl
        assert row["prefill_tokens"] > 0
    if case == "preemption":
        assert row["preemptions"] > 0
