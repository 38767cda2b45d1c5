"""Token parity with transformers, shared by the engine parity tests: a tiny random checkpoint saved by
``save_pretrained`` and read back through ``model.path=``, the caches the factory would build for it (one kind for
every layer, or the KV-cache groups of a ``kv_manager``), fixed random prompts, and transformers' greedy tokens.

Every test that compares kvbench's tokens with transformers' builds them here, so a new family's parity test is its
checkpoint case (tests/helpers/models.py) and its assertions."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import pytest
import torch

from kvbench.harness.kv.factory import cache_tensors
from kvbench.harness.kv.groups import kv_groups, layer_bytes_per_token, split_pool_bytes
from kvbench.harness.model.config import ModelConfig
from kvbench.harness.model.hf_config import resolve_model_config
from kvbench.harness.model.weights import build_model
from kvbench.harness.serving.engine import Engine
from kvbench.harness.serving.request import Request
from kvbench.impls.base import KVCache, layer_windows
from kvbench.impls.group_pool import PoolGroup
from kvbench.impls.grouped_paged import GroupedPagedCache
from kvbench.impls.kinds import PoolSpec, TensorSpec, cache_kind
from tests.helpers.models import make_hf_model

MAX_SEQ_LEN = 128
# impl -> (cache kind, kernel), as conf/impl/ names them
IMPLS = {"contiguous": ("contiguous", "sdpa"), "paged_torch": ("paged", "torch"), "paged_cuda": ("paged", "cuda"),
         "paged_triton": ("paged", "triton"), "paged_flex": ("paged", "flex")}
# (prompt, output) lengths: prompts shorter than, across and past a 24-token window, and generations that cross it
SHAPES = [(30, 20), (7, 26), (50, 9), (24, 3)]


def model_and_hf(case: str, folder: Path):
    """(model config, kvbench's model, transformers' model) of the checkpoint ``case``, saved in ``folder``."""
    hf = make_hf_model(case, seed=3)
    hf.save_pretrained(folder)
    hf.generation_config.eos_token_id = None
    cfg = resolve_model_config(ModelConfig(path=str(folder)))
    return cfg, build_model(cfg, torch.float32, "cpu", seed=0), hf


def _tensors(cfg: ModelConfig, scale: float | None, kv_dtype: str = "auto") -> TensorSpec:
    """What the factory allocates for ``cfg`` (an MLA model's latent as one kv head, stored once), at float32."""
    spec = cache_tensors(cfg, "float32", "cpu", kv_dtype)
    return spec if scale is None else replace(spec, scale=scale)


def _set_windows(cache: KVCache, cfg: ModelConfig) -> None:
    """The model's sliding windows, if it has a sliding layer (None: every layer attends to every key)."""
    windows = layer_windows(cfg.layer_types, cfg.sliding_window)
    if windows is not None:
        cache.set_layer_windows(windows)


def uniform_cache(cfg: ModelConfig, impl: str, block_size: int, scale: float | None = None,
                  windows: bool = True, kv_dtype: str = "auto") -> KVCache:
    """``impl``'s cache with every layer cached whole (kv_manager=uniform), four sequences of MAX_SEQ_LEN tokens;
    the model's windows mask unless ``windows`` is False; the model's softmax scale unless ``scale`` is given."""
    kind, kernel = IMPLS[impl]
    per_token = cfg.num_layers * layer_bytes_per_token(cfg, "float32", kv_dtype)
    spec = PoolSpec(kv_bytes=4 * MAX_SEQ_LEN * per_token, bytes_per_token=per_token, max_seq_len=MAX_SEQ_LEN,
                    block_size=block_size, max_num_seqs=4, min_tokens=1, watermark=0.0, prefix_caching=False)
    cache = cache_kind(kind).cache(spec, _tensors(cfg, scale, kv_dtype), kernel)
    if windows:
        _set_windows(cache, cfg)
    return cache


def grouped_cache(cfg: ModelConfig, manager: str, kernel: str, block_size: int) -> GroupedPagedCache:
    """The cache the factory builds under ``manager`` (harness/kv/factory.py grouped_layout), for one kind too."""
    groups = kv_groups(cfg, manager)
    layer = layer_bytes_per_token(cfg, "float32")
    kv_bytes = 4 * MAX_SEQ_LEN * cfg.num_layers * layer
    pools = split_pool_bytes(groups, kv_bytes, 1.0, layer) if manager == "split_pools" else [kv_bytes]
    spec = PoolSpec(kv_bytes=kv_bytes, bytes_per_token=cfg.num_layers * layer, max_seq_len=MAX_SEQ_LEN,
                    block_size=block_size, max_num_seqs=4, min_tokens=1, watermark=0.0, prefix_caching=False,
                    groups=tuple(PoolGroup(g.kind, g.num_layers, g.page_layers, g.pool) for g in groups),
                    pool_kv_bytes=tuple(pools), layer_bytes=layer, group_layers=tuple(g.layers for g in groups))
    cache = cache_kind("paged").cache(spec, _tensors(cfg, None), kernel)
    assert isinstance(cache, GroupedPagedCache)
    _set_windows(cache, cfg)
    return cache


def random_requests(vocab: int, shapes: Sequence[tuple[int, int]]) -> list[Request]:
    """One request a (prompt, output) length pair, prompts drawn from a fixed seed."""
    gen = torch.Generator().manual_seed(5)
    return [Request(i, tuple(torch.randint(0, vocab, (p,), generator=gen).tolist()), o)
            for i, (p, o) in enumerate(shapes)]


def generate(model, cache: KVCache, requests: list[Request], chunked: bool = False) -> dict[int, list[int]]:
    """kvbench's greedy tokens a request: four sequences a step, prompts whole or in chunks of 16 tokens."""
    engine = Engine(model, cache, 4, 16 if chunked else 512, chunked_prefill=chunked)
    return {s.request_id: list(s.output_ids) for s in engine.run(requests).sequences}


def hf_tokens(hf, requests: list[Request]) -> dict[int, list[int]]:
    """transformers' greedy tokens a request, each prompt alone."""
    out = {}
    for r in requests:
        ids = torch.tensor([r.prompt_ids])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.output_len,
                              min_new_tokens=r.output_len, do_sample=False, pad_token_id=0)
        out[r.request_id] = ref[0, ids.shape[1]:].tolist()
    return out


def parity_case(case: str, folder: Path, shapes: Sequence[tuple[int, int]] = SHAPES):
    """(model config, kvbench's model, transformers' model, the requests, transformers' tokens) of ``case``."""
    cfg, model, hf = model_and_hf(case, folder)
    requests = random_requests(cfg.vocab_size, shapes)
    return cfg, model, hf, requests, hf_tokens(hf, requests)


def served_tokens(run_dir: Path) -> tuple[dict[int, list[int]], list[Request]]:
    """A run folder's tokens.jsonl: each request's output tokens, and the requests (its prompt, its output length)
    it served, to ask transformers for the same."""
    records = [json.loads(line) for line in (run_dir / "tokens.jsonl").read_text().splitlines()]
    requests = [Request(r["request_id"], tuple(r["prompt_ids"]), len(r["output_ids"])) for r in records]
    return {r["request_id"]: r["output_ids"] for r in records}, requests


def family_fixture(cases, shapes: Sequence[tuple[int, int]] = SHAPES):
    """A module-scoped fixture ``family`` (``family = family_fixture(CASES)`` in a test module): ``parity_case`` of
    each case, one test per case."""
    @pytest.fixture(scope="module", params=sorted(cases))
    def family(request, tmp_path_factory):
        """(model config, our model, transformers' model, the requests, transformers' tokens) of one case."""
        return parity_case(request.param, tmp_path_factory.mktemp(request.param), shapes)
    return family


def serve_on_the_command_line(compose, run_dir: Path, cfg: ModelConfig, impl: str, prompt_len: int, output_len: int,
                              *overrides: str) -> tuple[dict, dict[int, list[int]], list[Request]]:
    """``python -m harness +impl=IMPL model.path=DIR ...``: 3 fixed requests of the checkpoint at fp32 on the CPU into
    ``run_dir``; its row (asserted ok), and what it served (``served_tokens``)."""
    from kvbench.harness.front.job import run_job

    rows, code = run_job(compose([
        f"+impl={impl}", f"model.path={cfg.path}", "model.weights=path", "dtype=float32", "device=cpu", "batch=3",
        "max_seq_len=64", "block_size=8", "workload=fixed", f"workload.prompt_len={prompt_len}",
        f"workload.output_len={output_len}", "workload.num_requests=3", *overrides]), run_dir)
    assert code == 0 and rows[0]["status"] == "ok", rows[0].get("error")
    return (rows[0], *served_tokens(run_dir))
