"""How far two impls' greedy tokens agree where exact parity cannot hold.

In fp32 the impls give the same tokens, and the report checks exactly that (equal output
digests). In bf16 or fp16 two logits can tie after rounding, and kernels that sum in another
order then pick different tokens; from there on the two sequences are different texts. What
can be asked of them is how far they go together: per request, the tokens equal up to its first
divergence, summed over requests, over the reference's tokens (the share vLLM's and SGLang's
kernel tests call prefix agreement). Read from the run folders' ``tokens.jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.harness.untrusted import TABLE_LIMIT, UntrustedError, read_text

from kvbench.harness.measure.agreement import Key, prefix_agreement  # noqa: F401 (the report's view of it)

EXACT_DTYPES = ("float32", "float64")  # where the impls must agree token for token


def read_tokens(folder: Path, impl: str) -> dict[Key, list[int]] | None:
    """``impl``'s output tokens per request in ``folder``/tokens.jsonl, or None when there are none to read.

    Data, never code: each line is parsed as JSON, and a line that is not a record of ids is skipped."""
    try:  # a regular file inside the folder, within the table limit (harness/untrusted.py)
        lines = read_text(folder / "tokens.jsonl", TABLE_LIMIT, root=folder).splitlines()
    except UntrustedError:
        return None
    out: dict[Key, list[int]] = {}
    for line in lines:
        try:
            rec = json.loads(line)
            if rec.get("impl") == impl and isinstance(rec.get("output_ids"), list):
                out[(int(rec["request_id"]), int(rec.get("sample", 0)))] = [int(t) for t in rec["output_ids"]]
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return out or None
