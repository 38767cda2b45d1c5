"""The simulated clock: what one scheduler step costs on a named GPU (a roofline per step, version 11).

Every input is a plain number; conf/gpu/*.yaml gives them per GPU, each with its source.
Symbols (bytes, seconds, FLOP):

    n     GPUs working on one model (tensor parallel: ``count``)
    A     achievable streaming bandwidth per GPU, bytes/s: the measured copy bandwidth
          (``copy_bandwidth_gbps``, read + write bytes / time) where one is known, else
          ``bandwidth_gbps * bw_efficiency`` (the datasheet figure times an assumed fraction)
    ea    the fraction of A that decode attention reaches reading the KV cache (``attn_bw_efficiency``)
    F     dense bf16/fp16 peak per GPU, FLOP/s (``fp8_tflops`` at weight_dtype=fp8 where the GPU has fp8
          tensor cores)    ef(g) = ef - (ef - ef0) * g0 / (g + g0): the fraction of it a step's matmuls reach
          (version 9), g one layer's GFLOP on one GPU (the step's FLOPs / (n*L)), from ef0 (``flops_efficiency_small``)
          to ef (``flops_efficiency``), half-way at g0 (``flops_ramp_gflop``); ef where a GPU file gives no ef0
    o     fixed cost of a step (host scheduling, input preparation), s: the engine's (``engine.step_overhead_us``)
    lo    fixed cost of each layer of a step (kernel launches and tails, syncs), s: the engine's
    p     the matmuls' knee (``engine.gemm_knee``, >= 1): a step's matmuls take mm(w, c) = (w^p + c^p)^(1/p) for a
          weight read of w seconds and FLOPs of c seconds; p null is max(w, c), a sharp roofline
    W     weight bytes a step streams: every weight as stored (``weight_dtype``), less an untied embedding table
          (a lookup reads a row a token); a tied one is the LM head and is read
    P     parameters a token multiplies by, less the embedding table and the LM head
    H     the LM head's parameters (vocab x h): 2*H FLOPs a row whose logits are computed
    Pe    of P, the routed experts' (k a token); they run at em = N / (N + n0) of the dense rate, N an expert's
          intermediate size over n (``engine.moe_gemm_half_n`` = n0; null: em = 1; version 10)
    ap    a prompt's attention FLOPs per (query, key) pair, every caching layer (model_cost.py); pairs(spans): the
          causal pairs of the positions a step computes of each prompt, a sliding layer's capped at its window
          (layer_terms.py)
    kvb   KV bytes per token (every layer, K and V)
    L     layers          h  hidden size   e    bytes per activation element
    link  an all-reduce's bus bandwidth, bytes/s;  lat  its latency, s: measured on n GPUs where the GPU file lists n
          (``allreduce_by_count``, version 11), else ``interconnect_gbps`` and ``interconnect_latency_us``

Tensor parallelism splits the weights, the KV heads and the FLOPs evenly over the n GPUs, so
the model sees n*A bytes/s and n*F*ef FLOP/s; each GPU still runs every layer, so o and L*lo
do not shrink. Each layer all-reduces its attention output and its MLP output (Megatron-style):
2*L ring all-reduces of m = tokens*h*e bytes, each lat + 2*(n-1)/n * m / link.

    fixed(T)       = o + L*lo + comm(T)     (version 6: o is the engine's, harness/serving/engine_profile.py)
    comm(T)        = 0 if n == 1, else 2*L * (lat + 2*(n-1)/n * T*h*e / link)
    decode_s(B, R) = fixed(B) + mm(W / (n*A),  cmp(B, B)) + R*a + 2*B*sb / (n*A)
        a = max(kvb / (n*A*ea),  af / (n*F*ef)): attention's KV read, or its FLOPs (af a KV token, every layer:
        harness/serving/model_cost.py; only MLA's absorbed attention reaches them, version 7); sb: a sequence's
        linear-attention state, read and rewritten each step (Qwen3-Next; 0 for every other model)
        B sequences make one token each; R = KV tokens the step's attention reads
        (every sequence's context, its new token included; a slab cache reads B x the
        longest of them, version 3 below). The matmuls stream the
        weights or are compute-bound; attention runs in kernels of its own after them,
        so its KV read adds to the step instead of hiding under the weights' read.
    cmp(T, S)      = (2*(P - Pe)*T + 2*H*S) / (n*F*ef) + 2*Pe*T / (n*F*ef*em)     the matmuls' FLOPs, in seconds
    prefill_s(T, S) = fixed(T) + mm(W / (n*A),  cmp(T, S)) + pairs(spans)*ap / (n*F*ef)
        T prompt tokens computed (prefix-cache hits are not) of S prompts, each one row of logits. The
        simulator passes T and the spans: S = 1 is assumed, which leaves out (S-1)*2*H FLOPs, under 0.1% of a prefill of
        S prompts of 100 tokens or more (H is under 1/50 of P for the models here). Matmuls of a few hundred rows
        reach neither the streaming rate nor the FLOP rate (the knee p): a small prefill costs more than one
        weight read; a large one is compute-bound, where the knee changes little. The prompts' attention
        (FlashAttention's kernels, after the matmuls) runs at the bf16 peak times a large step's ef (at fp8 weights
        too: attention runs at the activations' dtype), an assumption: quadratic, it is 4% of a
        2,048-token prompt's FLOPs for Llama-3.1-8B and 9% at 5,000 (more at fp8, whose matmuls run faster).
    mixed_s(T, B, R) = fixed(T+B) + mm(W / (n*A),  cmp(T+B, B+1)) + R*a + pairs(spans)*ap / (n*F*ef)
        chunked prefill's step: T prompt-chunk tokens and B decodes in one forward: one weight read serves
        both, the FLOPs add up, the decodes' KV read adds.
        mixed_s(T, 0, 0) = prefill_s(T) and mixed_s(0, B, R) = decode_s(B, R). A chunk attends to the prompt's
        earlier chunks: its pairs count them.
    decode_s(B, R, k) = sum over j = 0..k-1 of decode_s(B, R + j*B)
        k steps of an unchanged batch, each reading B more KV tokens than the one before:
        only the attention term grows, so the sum is k*decode_s(B, R) + B*kvb/(n*A*ea) * k*(k-1)/2.

Version 1 (before 2026-12-02) had no attention term of its own (the KV read shared the weights'
max with the compute), no per-layer cost, no prefill floor, and the datasheet bandwidth times
bw_efficiency everywhere. Version 2 (before 2026-12-03) priced every cache's decode attention by
the sum of its sequences' contexts; version 3 prices what the cache's kernel reads (``R`` is the
allocator's ``decode_read_tokens``): a slab cache (contiguous, Orca) attends over a padded batch,
every sequence up to the longest context, so its R is B x the longest; a paged cache's is the sum
(the PagedAttention kernel's read, which the roofline prices for every paged impl; a profile instead prices
its own impl's kernel, and paged_torch's reference gathers a padded window: kernels/read_pattern.py).
Version 4 (2026-12-06) prices layers that read less (harness/serving/layer_terms.py): a sliding-window
layer's attention reads at most its window, ``R`` above becoming ``windowed_read(B, R)``; a mixture of
experts reads the dense weights plus the experts its tokens route to (``W - unread(T)``, T the step's tokens)
and computes with the active parameters (``P - inactive``: k experts a token). A model of full-attention
layers and dense MLPs is priced as by version 3. Version 5 (2026-12-06) counts the work that is there: FLOPs are
the non-embedding parameters' plus the LM head's per row of logits (version 4 counted 2*params a token, the
embedding lookup as a matmul: +15% for an 8B model's prefill); a decode step streams no embedding table (version 4
read it every step: +6.5% for an 8B model); weights are priced at ``weight_dtype`` (fp8: a byte a value, computed
at ``fp8_tflops``); a GPU's memory is its driver-reported MiB (``memory_mib``), not decimal GB. Version 6 (2026-12-06)
takes the host's costs from the engine (``engine=NAME``, conf/engine/): o, a cost per sequence, lo, async scheduling
(max of host and device), multi-step (host / k) and a request's front-end cost on its TTFT and E2EL (version 5:
o = 500 us, lo = 30 us in every GPU file, in series). Version 7 (2026-12-06) prices the caches that are not K and V
(issue 45): decode attention costs the larger of its KV read and its FLOPs (MLA's absorbed attention, 242 FLOPs a
byte for DeepSeek-V3 in bf16, is compute-bound where GQA's 8-16 is memory-bound: harness/serving/model_cost.py),
and a linear-attention layer reads and rewrites each sequence's state every step (a prefill, once a prompt). Every
model of K/V layers is priced as by version 6 (its attention, 1-16 FLOPs a byte, stays under a tenth of any
GPU file's ridge, 200-500 FLOPs a byte). Version 8 (2026-12-06) takes the matmuls' knee from the engine
(``gemm_knee``, conf/engine/): near the ridge a matmul reaches neither the streaming rate nor the FLOP rate, and
the knee's shape is the GEMM kernels', which the engine picks (PyTorch's cuBLAS calls under vLLM and SGLang,
TensorRT-LLM's own); it replaces version 7's prefill floor (a prefill cost at least 1.5 weight reads, on every GPU,
``prefill_weight_multiple``) and its sharp max in decode. Version 8's GPU files also read the KV cache in decode
attention at 0.9 of A (0.6 before): ea is the rate at which attention's time grows with its read, its kernels'
fixed part being in L*lo (conf/gpu/*.yaml say from which profiles). Version 9 (2026-12-06) lets the matmuls' FLOP
efficiency grow with a step's work (ef(g) above, each ef being ef(g) of the step's g: a small GEMM fills fewer of the
card's tiles and waves), fitted per GPU to Vidur's profiled linear layers; version 8 priced every step at one ef
(0.6), which priced the A100's and H100's prefills of 1-4k tokens 16-22% slow. By work, not rows: a 72B model's
layer at 128 rows is as much work as a 7B one's at 1,000 (by rows alone the H100's fit left a p90 error of 22%).
``ROOFLINE_VERSION`` is in every roofline-priced job's identity: a resumed sweep keeps no row another version priced.

A host tier (``device.host_kv_gb``) or swap copies whole blocks over the host link (PCIe, or
NVLink-C2C where that is the link) between steps:

    hlink  host <-> device bandwidth per GPU and direction, bytes/s (``host_link_gbps``)
    hlat   fixed cost of one transfer, s (``host_link_latency_us``)
    host_copy_s(S, D, b) = T * 2*L*hlat + (S + D) * b*kvb / (n*hlink)
        S blocks stored (device -> host) and D loaded (host -> device), of b tokens; each GPU moves
        its 1/n of the KV over its own link. T counts the transfers (``host_copy``):
        - batched (default): one gather copy per layer's K and V and per direction for the step's
          blocks, as kvbench's own engine does (impls/paged.py ``copy_host``) and today's offloading
          engines do: T = [S > 0] + [D > 0];
        - per_block: one copy per block, as vLLM's swap_blocks issued them when the PagedAttention
          paper measured swapping: T = S + D. Small blocks then pay hlat more often, what makes swap
          lose at small blocks (the paper's Fig. 19).
        The step waits for its copies: they do not overlap compute (a copy back must land before
        attention reads it; an evicted block's store must leave before the step overwrites it).
        An engine that stores asynchronously, or overlaps loads with earlier layers, pays less.

Version 10 (2026-12-06) prices a prompt's attention (version 9 left it out: 13% of a 2,048-token Qwen3-30B-A3B
prompt's FLOPs) and the routed experts' grouped GEMMs at em of the dense rate (version 9 priced them as dense GEMMs:
Qwen3-30B-A3B's 8,192-token steps at about half the time its published TTFTs imply; conf/engine/vllm_v1.yaml gives
em's source, published fused_moe kernel times). Version 11 (2026-12-07) prices an all-reduce on n GPUs by what was
measured on n where a GPU file lists it (``allreduce_by_count``: NCCL's all_reduce_perf at 1-32 MiB on A100, H100 and
H200 at 4 and 8 GPUs, 19-36 us and 174-338 GB/s; version 10 priced every n at the 2-GPU figures, 10 us and 208-370 GB/s,
which a decode's 4-16 MiB all-reduces on 8 GPUs take 1.4-1.7x as long as).

Left out on purpose: KV writes and activation traffic, sampling, and any overlap of communication with compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from kvbench.harness.config import Config
from kvbench.harness.errors import ConfigError
from kvbench.harness.serving.engine_profile import EngineSpec, engine_spec, is_offline
# The GPU's figures: their own module; named here too, where the clock's callers have always found them.
from kvbench.harness.serving.gpu_spec import GpuSpec, gpu_spec  # noqa: F401
from kvbench.harness.serving.layer_terms import Spans, prefill_pairs, windowed_read, windowed_read_over_steps
# What the clock needs of a model: its own module; named here too, where the clock's callers have always found them.
from kvbench.harness.serving.model_cost import ModelCost, model_cost  # noqa: F401

# Bump when a formula below changes what a step costs: job identities of roofline-priced runs change with it.
ROOFLINE_VERSION = 11


@dataclass(frozen=True)
class CostModel:
    """Prices the scheduler's steps: ``prefill_s(tokens)`` and ``decode_s(batch, kv_tokens_read, steps)``."""

    gpu: GpuSpec
    model: ModelCost
    per_block: bool = False  # host copies: a transfer per block (host_copy=per_block), else one per direction
    engine: EngineSpec = EngineSpec()  # the host's costs and scheduling (neutral: none, in series)

    # The rates and fixed costs below are derived from the frozen figures once (cached_property
    # writes the instance's __dict__, which a frozen dataclass allows): a simulation prices
    # millions of steps, and recomputing them per step was a third of its time.
    @cached_property
    def bytes_per_s(self) -> float:  # n*A: the weights' streaming rate
        return self.gpu.count * self.gpu.achievable_gbps * 1e9

    @cached_property
    def attn_bytes_per_s(self) -> float:  # n*A*ea: the KV cache's read rate in decode attention
        return self.bytes_per_s * self.gpu.attn_bw_efficiency

    @cached_property
    def _fp8_cores(self) -> bool:  # fp8 weights on a GPU with fp8 tensor cores: W8A8 at fp8_tflops
        return self.model.fp8 and self.gpu.fp8_tflops is not None

    @cached_property
    def _peak_flops_per_s(self) -> float:  # n*F; F: the fp8 peak for fp8 weights where the GPU has fp8 tensor cores
        return self.gpu.count * (self.gpu.fp8_tflops if self._fp8_cores else self.gpu.tflops) * 1e12

    @cached_property
    def flops_per_s(self) -> float:  # n*F*ef, a large step's (fp8 on fp8 cores: fp8_flops_efficiency where set)
        g = self.gpu
        ef = g.fp8_flops_efficiency if self._fp8_cores and g.fp8_flops_efficiency else g.flops_efficiency
        return self._peak_flops_per_s * ef

    @cached_property
    def _expert_rate(self) -> float:  # em = N / (N + n0), N an expert's width on one GPU (tensor parallel splits it)
        return self.engine.expert_rate(self.model.experts.width / self.gpu.count)

    def compute_s(self, flops: float, expert_flops: float = 0.0) -> float:
        """A step's matmuls of ``flops`` FLOPs, ``expert_flops`` of them routed experts', at n*F*ef(g) (fp8 on fp8
        cores: one efficiency, no profile by size), the experts' at em of that rate."""
        if self._fp8_cores:
            rate = self.flops_per_s
        else:
            layer_gflop = flops / (self.gpu.count * self.model.num_layers * 1e9)
            rate = self._peak_flops_per_s * self.gpu.flops_efficiency_at(layer_gflop)
        return (flops - expert_flops) / rate + expert_flops / (rate * self._expert_rate)

    def matmul_compute_s(self, rows: int, logits_rows: int) -> float:
        """compute_s of a forward of ``rows`` token rows, ``logits_rows`` of them computing logits."""
        return self.compute_s(self.model.flops(rows, logits_rows), self.model.experts.flops(rows))

    def prompt_attention_s(self, spans: Spans) -> float:
        """The attention of a step's prompt ``spans`` (quadratic; a sliding layer's capped at its window), at the
        dense bf16 rate: pairs x FLOPs a pair / (n*F*ef)."""
        if not spans:
            return 0.0
        pairs = prefill_pairs(self.model.windows, spans)
        return pairs * self.model.prefill_flops_per_pair / self.attn_flops_per_s

    @cached_property
    def layers_s(self) -> float:  # L*lo: device time
        return self.engine.layers_s(self.model.num_layers)

    @property
    def frontend_s(self) -> float:  # fe: each request's TTFT and E2EL gain it (0 offline)
        return self.engine.frontend_s

    @cached_property
    def attn_flops_per_s(self) -> float:  # n*F*ef at the dense (bf16) peak: attention runs at the activations' dtype
        g = self.gpu
        return g.count * g.tflops * 1e12 * g.flops_efficiency

    @cached_property
    def _attn_s_per_token(self) -> float:  # max(kvb / (n*A*ea), af / (n*F*ef)): MLA's absorbed attention is the FLOPs
        m = self.model
        return max(m.kv_bytes_per_token / self.attn_bytes_per_s, m.attn_flops_per_token / self.attn_flops_per_s)

    def state_s(self, seqs: int) -> float:
        """``seqs`` sequences' linear-attention state read and rewritten once each (2*S*sb / (n*A)); 0 without one."""
        return 2 * seqs * self.model.state_bytes_per_seq / self.bytes_per_s

    @cached_property
    def _decode_fixed(self) -> dict[int, float]:
        """batch -> L*lo + comm(B) + mm(W / (n*A), 2*P*B / (n*F*ef)): the device time of a decode step its KV
        read does not change (the host's is the engine's), memoized per batch."""
        return {}

    def _decode_base_s(self, batch: int) -> float:
        base = self._decode_fixed.get(batch)
        if base is None:
            compute = self.matmul_compute_s(batch, batch)
            base = self._decode_fixed[batch] = (self.layers_s + self.comm_s(batch)
                                                + self.engine.matmul_s(self.weights_s(batch), compute)
                                                + self.state_s(batch))
        return base

    def comm_s(self, tokens: int) -> float:
        """2*L ring all-reduces of tokens*h*e bytes; none on one GPU."""
        g, m = self.gpu, self.model
        if g.count == 1:
            return 0.0
        return 2 * m.num_layers * g.allreduce_s(tokens * m.hidden_size * m.elem_bytes)

    def weights_s(self, tokens: int | None = None) -> float:
        """One read of the weights at the streaming rate: of a mixture, the experts ``tokens`` tokens route to
        (None: every expert)."""
        unread = 0.0 if tokens is None else self.model.experts.unread_bytes(tokens)
        return (self.model.weight_bytes - unread) / self.bytes_per_s

    def attention_s(self, kv_tokens_read: int, batch: int = 0) -> float:
        """Decode attention of ``batch`` sequences whose contexts sum to ``kv_tokens_read`` tokens (all layers, K
        and V), a sliding layer reading at most its window (``batch`` 0: unknown, every token read)."""
        return windowed_read(self.model.windows, batch, kv_tokens_read) * self._attn_s_per_token

    def prefill_s(self, tokens: int, prompts: int = 1, spans: Spans = ()) -> float:
        """``tokens`` prompt tokens of ``prompts`` prompts (each one row of logits) in one forward; ``spans``: the
        positions computed of each prompt, for its attention (none given: not priced)."""
        compute = self.matmul_compute_s(tokens, prompts)
        device = (self.layers_s + self.engine.matmul_s(self.weights_s(tokens), compute) + self.comm_s(tokens)
                  + self.prompt_attention_s(spans) + self.state_s(prompts))
        return self.engine.step_s(self.engine.host_s(prompts, decode=False), device)

    def host_copy_s(self, stores: int, loads: int, block_tokens: int) -> float:
        """``stores`` blocks device -> host then ``loads`` host -> device, of ``block_tokens`` tokens: not
        overlapped; ``self.per_block`` (host_copy=per_block): a transfer per block, else one per direction."""
        blocks = stores + loads
        if not blocks:
            return 0.0
        g, m = self.gpu, self.model
        if g.host_link_gbps is None:
            raise ConfigError(f"gpu={g.name}: a host tier or swap copies over the host link, but gpu.host_link_gbps "
                              f"is not set (conf/gpu/{g.name}.yaml or gpu.host_link_gbps=GBPS)")
        transfers = blocks if self.per_block else (stores > 0) + (loads > 0)
        return (transfers * 2 * m.num_layers * g.host_link_latency_us * 1e-6
                + blocks * block_tokens * m.kv_bytes_per_token / (g.count * g.host_link_gbps * 1e9))

    def mixed_s(self, tokens: int, batch: int, kv_tokens_read: int, spans: Spans = ()) -> float:
        """One chunked-prefill step: ``tokens`` prompt-chunk tokens (``spans``: each chunk's positions) and
        ``batch`` decodes reading ``kv_tokens_read`` KV tokens, in one forward."""
        if not tokens:
            return self.decode_s(batch, kv_tokens_read) if batch else 0.0
        rows = tokens + batch
        compute = self.matmul_compute_s(rows, batch + 1)  # the decodes' logits and one prompt's
        device = (self.layers_s + self.engine.matmul_s(self.weights_s(rows), compute) + self.comm_s(rows)
                  + self.attention_s(kv_tokens_read, batch) + self.prompt_attention_s(spans)
                  + self.state_s(batch + 1))  # the decodes' states and the prompt's
        return self.engine.step_s(self.engine.host_s(batch + 1, decode=False), device)  # the decodes and a prompt

    def decode_s(self, batch: int, kv_tokens_read: int, steps: int = 1) -> float:
        """``steps`` decode steps of ``batch`` sequences; the first reads ``kv_tokens_read`` KV tokens,
        each later one ``batch`` more. In series each costs host + device; under async scheduling the first
        ``hidden`` cost the host's time (their device time is shorter), the rest their device time."""
        if steps < 1:
            raise ValueError(f"steps={steps} must be >= 1")
        host, base = self.engine.host_s(batch), self._decode_base_s(batch)
        hidden = self.engine.host_bound_steps(  # async: the first steps, as a step's device time grows with its read
            host, lambda j: base + self.attention_s(kv_tokens_read + j * batch, batch), steps)
        rest = steps - hidden
        in_series = 0.0 if self.engine.async_scheduling else host
        # Step j reads j*batch more tokens than step 0 (a sliding layer's read stops growing at its window).
        read = windowed_read_over_steps(self.model.windows, batch, kv_tokens_read + hidden * batch, rest)
        return hidden * host + rest * (base + in_series) + read * self._attn_s_per_token

    def decode_price_s(self, batch: int, kv_tokens_read: int, steps: int = 1) -> float:
        """``decode_s`` (the roofline counts nothing, so the two are one)."""
        return self.decode_s(batch, kv_tokens_read, steps)

    def decode_steps_s(self, batch: int, kv_tokens_read: int, steps: int) -> list[float]:
        """Each of ``steps`` decode steps' own price: ``decode_s(batch, kv_tokens_read + j*batch)`` for
        j < steps, the inter-token gaps of a jump."""
        host, base, step = self.engine.host_s(batch), self._decode_base_s(batch), self.engine.step_s
        if self.model.windows:
            return [step(host, base + self.attention_s(kv_tokens_read + j * batch, batch)) for j in range(steps)]
        per_token = self._attn_s_per_token
        one = base + kv_tokens_read * per_token
        grow = batch * per_token
        return [step(host, one + j * grow) for j in range(steps)]


def cost_model_for(cfg: Config) -> CostModel:
    """The clock of a resolved ``Config`` whose ``gpu`` is set."""
    if cfg.gpu is None:
        raise ConfigError("the simulated clock needs a GPU: gpu=NAME (conf/gpu/)")
    engine = EngineSpec() if cfg.engine is None else engine_spec(cfg.engine, is_offline(cfg))  # None: unresolved
    return CostModel(gpu_spec(cfg.gpu), model_cost(cfg.model, cfg.dtype, cfg.kv_dtype, cfg.kv_scale, cfg.weight_dtype),
                     per_block=cfg.host_copy == "per_block", engine=engine)
