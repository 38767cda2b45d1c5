"""A new kernel is one module plus one impl YAML: no other edit, found by every-impl runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO_ROOT

PLUGIN = '''
"""A throwaway paged kernel: the torch reference, counting its calls."""
import os

from kvbench.kernels.reference import paged_decode_attention_ref, write_kv_ref


def decode(q, k_cache, v_cache, block_tables, context_lens, scale, out=None):
    with open(os.environ["KVB_PLUGIN_LOG"], "a") as log:
        log.write("decode\\n")
    res = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale)
    return res if out is None else out.copy_(res)


def write(key, value, k_cache, v_cache, slot_mapping):
    write_kv_ref(key, value, k_cache, v_cache, slot_mapping)
'''
IMPL = "name: paged_plugin\ncache: paged\nkernel: kvb_plugin.decode_kernel\nprefix_caching: true\n"
SMALL = ["model=tiny-llama", "dtype=float32", "device=cpu", "max_seq_len=64", "batch=3", "workload=fixed",
         "workload.num_requests=3", "workload.prompt_len=20", "workload.output_len=5", "scenario.warmup=0",
         "hydra/job_logging=disabled"]


@pytest.fixture
def plugin(tmp_path) -> tuple[Path, dict]:
    (tmp_path / "kvb_plugin").mkdir()
    (tmp_path / "kvb_plugin" / "__init__.py").write_text("")
    (tmp_path / "kvb_plugin" / "decode_kernel.py").write_text(PLUGIN)
    (tmp_path / "conf" / "impl").mkdir(parents=True)
    (tmp_path / "conf" / "impl" / "paged_plugin.yaml").write_text(IMPL)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO_ROOT}",
           "KVB_PLUGIN_LOG": str(tmp_path / "calls.log")}
    return tmp_path, env


def harness(env: dict, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *overrides], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_kernel_module_and_a_yaml_join_every_impl_run(plugin):
    tmp, env = plugin
    out = tmp / "run"
    proc = harness(env, f"hydra.searchpath=[file://{tmp / 'conf'}]", *SMALL, f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pd.read_csv(out / "rows.csv").set_index("impl")
    assert {"contiguous", "paged_torch", "paged_cuda", "paged_triton", "paged_plugin"} <= set(rows.index)
    assert (rows.status == "ok").all(), rows.error.to_dict()
    assert rows.at["paged_plugin", "kernel_backend"] == "kvb_plugin.decode_kernel"
    assert rows.at["paged_plugin", "output_digest"] == rows.at["contiguous", "output_digest"]
    assert (tmp / "calls.log").read_text().count("decode") > 0  # the module's kernel really ran
    tokens = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    by_impl = {impl: [t["output_ids"] for t in tokens if t["impl"] == impl] for impl in ("contiguous", "paged_plugin")}
    assert by_impl["paged_plugin"] == by_impl["contiguous"]


def test_an_unimportable_kernel_module_is_a_one_line_error(plugin):
    tmp, env = plugin
    (tmp / "conf" / "impl" / "paged_plugin.yaml").write_text(IMPL.replace("decode_kernel", "no_such_kernel"))
    out = tmp / "bad"
    proc = harness(env, f"hydra.searchpath=[file://{tmp / 'conf'}]", "+impl=paged_plugin", *SMALL, f"hydra.run.dir={out}")
    assert proc.returncode == 2
    assert "kvb_plugin.no_such_kernel" in proc.stderr + proc.stdout and "dotted path" in proc.stderr + proc.stdout


def test_alias_composes_its_target_and_is_not_an_impl_of_its_own(compose):
    from kvbench.harness.front.groups import impl_names
    from kvbench.harness.front.resolve import resolve

    assert "paged" not in impl_names() and "paged_triton" in impl_names()
    cfg = resolve(compose(["+impl=paged", "device=cpu"]))  # the device's native kernel (harness/front/native.py)
    assert (cfg.impl.name, cfg.impl.cache, cfg.impl.kernel) == ("paged_cuda", "paged", "cuda")
    from kvbench.harness.front.groups import load_impl

    assert load_impl("paged") == load_impl("paged_triton") and load_impl("orca_max").name == "contiguous"


def test_cpu_and_auto_simulate_the_same_device(compose):
    from kvbench.harness.front.resolve import CPU_MEMORY_GB, resolve

    assert resolve(compose(["device=cpu"])).device.memory_gb == CPU_MEMORY_GB
    auto = resolve(compose(["device=auto"]))
    if auto.device.name == "cpu":  # on a GPU machine auto picks the GPU
        assert auto.device.memory_gb == CPU_MEMORY_GB


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_the_sdpa_kernel_is_the_reference_on_a_slab_of_one_block_per_sequence(dtype, tol):
    """A slab [lanes, L, kv_heads, D] is a pool of blocks of L slots: the registry's ``sdpa`` kernel
    reads it as the reference kernel does, with tables naming each sequence's lane, or none (in order)."""
    import torch

    from kvbench.kernels.reference import paged_decode_attention_ref, write_kv_ref
    from kvbench.kernels.registry import get_paged_kernel

    sdpa = get_paged_kernel("sdpa")
    assert sdpa.name == "sdpa" and not sdpa.out_variant
    gen = torch.Generator().manual_seed(7)
    dt = getattr(torch, dtype)
    lanes, length, heads, kv_heads, dim = 6, 97, 8, 2, 64
    k = torch.randn(lanes, length, kv_heads, dim, generator=gen).to(dt)
    v = torch.randn(lanes, length, kv_heads, dim, generator=gen).to(dt)
    q = torch.randn(4, heads, dim, generator=gen).to(dt)
    tables = torch.tensor([[5], [0], [3], [1]], dtype=torch.int32)
    lens = torch.tensor([1, 17, 54, 97], dtype=torch.int32)
    scale = dim**-0.5
    ref = paged_decode_attention_ref(q, k, v, tables, lens, scale)
    out = torch.full_like(q, float("nan"))
    got = sdpa.decode(q, k, v, tables, lens, scale, out, max_context=97)
    assert got is out and (got.float() - ref.float()).abs().max() < tol
    # In order, every key visible: SDPA over a view of the first lanes, with no mask.
    in_order = torch.arange(4, dtype=torch.int32)[:, None]
    full = torch.full((4,), 54, dtype=torch.int32)
    ref = paged_decode_attention_ref(q, k, v, in_order, full, scale)
    got = sdpa.decode(q, k[:4, :54], v[:4, :54], None, None, scale)
    assert (got.float() - ref.float()).abs().max() < tol
    # Its write is the reference's: lane s, position p is row s * L + p.
    key, value = torch.randn(2, kv_heads, dim, generator=gen).to(dt), torch.randn(2, kv_heads, dim, generator=gen).to(dt)
    mapping = torch.tensor([2 * length + 5, 4 * length], dtype=torch.long)
    expect_k, expect_v = k.clone(), v.clone()
    write_kv_ref(key, value, expect_k, expect_v, mapping)
    sdpa.write(key, value, k, v, mapping)
    assert torch.equal(k, expect_k) and torch.equal(v, expect_v) and torch.equal(k[2, 5], key[0])
