"""How far two runs' greedy tokens agree: the tokens equal up to each request's first divergence.

Two runs of the same requests that differ in a way rounding can reach (bf16 kernels summing in
another order, a quantized KV cache) pick different tokens somewhere, and from there on the two
sequences are different texts. What can be asked of them is how far they go together: per request,
the tokens equal up to its first divergence, summed over requests, over the reference's tokens (the
share vLLM's and SGLang's kernel tests call prefix agreement). Plain Python: the report reads it too.
"""

from __future__ import annotations

Key = tuple[int, int]  # (request_id, sample)


def prefix_agreement(reference: dict[Key, list[int]], other: dict[Key, list[int]]) -> float | None:
    """Tokens equal up to each request's first divergence, over the reference's tokens (requests both have)."""
    matched = total = 0
    for key, ref in reference.items():
        if key not in other:
            continue
        out = other[key]
        same = 0
        for a, b in zip(ref, out):
            if a != b:
                break
            same += 1
        matched += same
        total += len(ref)
    return matched / total if total else None
