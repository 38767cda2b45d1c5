"""Decode forwards as pieces around the cache's attention; on a GPU each piece is a CUDA graph.

Eager decode of a large model is host-bound on a fast GPU: every layer launches about
forty small kernels from Python (an 8B model on an H200 took 23-30 ms per step with its
host time within 0.4 ms of the step time), so eager tokens/s measure Python, not the
KV cache. vLLM's answer is piecewise CUDA graphs, and this is the same split:

* piece 0: embedding, RoPE cos/sin and layer 0 up to its attention;
* piece l: layer l-1 after its attention (o_proj, residual, norm, MLP) and layer l up
  to its attention (norm, q/k/v projection, RoPE);
* piece L: the last layer after its attention, the final norm and the logits.

The dense work in the pieces is the same for every impl, and is captured once per
padded batch size and replayed with one launch. The attention between two pieces is the
cache's ``forward_decode``, run eagerly exactly as without graphs: each impl keeps its
own kernel, its own host work and its dynamic shapes, and nothing else is billed to it.

A batch of ``n`` sequences runs in the smallest captured size ``N >= n``: the padding
rows compute values nothing reads, and the attention sees only the first ``n`` rows.
Every piece reads and writes fixed buffers, so a graph replays on new inputs. With
``capture=False`` (a CPU) the same pieces run eagerly over the same buffers: the CPU
tests exercise everything but the capture itself.
"""

from __future__ import annotations

import bisect
import gc
from dataclasses import dataclass
import torch

from kvbench.harness.model.llama import AttentionFn, LlamaModel


MAX_CAPTURE_SIZE = 512


def capture_sizes(max_batch: int) -> list[int]:
    """vLLM's batch sizes: 1, 2, 4, then every multiple of 8, up to and including ``max_batch``."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = {s for s in (1, 2, 4) if s < max_batch} | set(range(8, max_batch, 8)) | {max_batch}
    return sorted(sizes)


@dataclass
class _Buffers:
    """Every tensor a piece reads or writes, at the largest size; a batch of N uses rows ``[:N]``."""

    ids: torch.Tensor  # [N] token ids
    positions: torch.Tensor  # [N]
    cos: torch.Tensor  # [N, head_dim]
    sin: torch.Tensor
    hidden: tuple[torch.Tensor, torch.Tensor]  # [N, hidden]: piece l writes hidden[l % 2], piece l+1 reads it
    q: torch.Tensor  # [N, heads, head_dim]
    k: torch.Tensor  # [N, kv_heads, head_dim]
    v: torch.Tensor
    attn: torch.Tensor  # [N, heads, head_dim]: the cache's attention output, read by the next piece
    logits: torch.Tensor  # [N, vocab] float32


def _buffers(model: LlamaModel, size: int) -> _Buffers:
    cfg, dtype, device = model.cfg, model.dtype, model.device

    def zeros(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dt, device=device)

    # What the cache's attention takes and gives: K and V of every kv head, or MLA's absorbed form (one kv head
    # of the latent and its rotary key, harness/model/deepseek.py); RoPE's cos and sin stay at head_dim (MLA's
    # rotary part).
    latent = cfg.kv_lora_rank > 0
    kv_heads, width = (1, cfg.kv_lora_rank + cfg.qk_rope_head_dim) if latent else (cfg.num_kv_heads, cfg.head_dim)
    return _Buffers(
        ids=zeros(size, dt=torch.long), positions=zeros(size, dt=torch.long),
        cos=zeros(size, cfg.head_dim), sin=zeros(size, cfg.head_dim),
        hidden=(zeros(size, cfg.hidden_size), zeros(size, cfg.hidden_size)),
        q=zeros(size, cfg.num_heads, width), k=zeros(size, kv_heads, width),
        v=zeros(size, kv_heads, width), attn=zeros(size, cfg.num_heads, width),
        logits=zeros(size, cfg.vocab_size, dt=torch.float32),
    )


class PiecewiseDecode:
    """The model's decode forward in ``num_layers + 1`` pieces, captured per batch size when ``capture``."""

    def __init__(self, model: LlamaModel, max_batch: int, capture: bool) -> None:
        if capture and model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the model is on {model.device}")
        self.model = model
        if capture:  # capturing empties the allocator's cache: empty it first, so the delta is the graphs'
            torch.cuda.synchronize(model.device)
            gc.collect()
            torch.cuda.empty_cache()
            free_before = torch.cuda.mem_get_info(model.device)[0]
            reserved_before = torch.cuda.memory_reserved(model.device)
        # Larger batches run eagerly (vLLM captures up to 512 by default too).
        self.sizes = capture_sizes(min(max_batch, MAX_CAPTURE_SIZE))
        self.max_batch = self.sizes[-1]
        self.num_pieces = model.cfg.num_layers + 1
        self.buf = _buffers(model, self.max_batch)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        # Device memory the graphs hold for the whole run (their pool and the buffers): charged
        # to the KV budget, as vLLM does, by capturing before the budget is measured.
        self.pool_bytes = 0
        if capture:
            self._capture()
            # The driver's own memory for instantiated graphs shows only in mem_get_info.
            self.pool_bytes = max(0, free_before - torch.cuda.mem_get_info(model.device)[0],
                                  torch.cuda.memory_reserved(model.device) - reserved_before)

    def padded_size(self, n: int) -> int:
        if not 1 <= n <= self.max_batch:
            raise ValueError(f"a decode batch of {n} is outside the captured sizes 1..{self.max_batch}")
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def _piece(self, index: int, size: int) -> None:
        """Piece ``index`` over the first ``size`` rows of the buffers (what a graph records)."""
        model, b = self.model, self.buf
        if index == 0:
            h, cos, sin = model.embed(b.ids[:size], b.positions[:size])
            b.cos[:size].copy_(cos)
            b.sin[:size].copy_(sin)
        else:
            h = model.layers[index - 1].after_attention(b.hidden[(index - 1) % 2][:size], b.attn[:size])
        if index == self.num_pieces - 1:
            b.logits[:size].copy_(model.logits(h))
            return
        q, k, v = model.layers[index].before_attention(h, b.cos[:size], b.sin[:size])
        b.hidden[index % 2][:size].copy_(h)
        b.q[:size].copy_(q)
        b.k[:size].copy_(k)
        b.v[:size].copy_(v)

    @torch.inference_mode()
    def _capture(self) -> None:
        """One graph per piece and size, largest size first, all in one memory pool: replays never
        overlap, so what one capture frees the next may reuse (as vLLM shares its pool)."""
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        # One side stream for the warm-up and every capture (as vLLM's graph_capture does). torch keeps a
        # cuBLAS/cuBLASLt workspace per (handle, stream): a warm-up on another stream than the capture's
        # (torch.cuda.graph's own internal one, when given no stream) would leave the capture stream's
        # workspace to be created inside the first capture. And captures sharing a pool should share
        # their stream (torch.cuda.graph's note on pools).
        side = torch.cuda.Stream()
        for size in reversed(self.sizes):
            # A first eager pass on that stream: lazy initialisations (cuBLAS handles and
            # workspaces) must not happen inside a capture.
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for index in range(self.num_pieces):
                    self._piece(index, size)
            torch.cuda.current_stream().wait_stream(side)
            graphs = []
            for index in range(self.num_pieces):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=side):
                    self._piece(index, size)
                graphs.append(graph)
            self.graphs[size] = graphs
        torch.cuda.synchronize()

    def _run_piece(self, index: int, size: int) -> None:
        graphs = self.graphs.get(size)
        if graphs is None:
            self._piece(index, size)
        else:
            graphs[index].replay()

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        """Decode logits ``[n, vocab]`` for ``n`` tokens, attending through ``attention`` between pieces."""
        n = input_ids.shape[0]
        size = self.padded_size(n)
        b = self.buf
        b.ids[:n].copy_(input_ids)
        b.positions[:n].copy_(positions)
        for index in range(self.num_pieces - 1):
            self._run_piece(index, size)
            out = attention(index, b.q[:n], b.k[:n], b.v[:n])
            b.attn[:n].copy_(out.reshape(n, *b.attn.shape[1:]))
        self._run_piece(self.num_pieces - 1, size)
        return b.logits[:n]

