"""A test-only paged kernel (loaded by dotted path, kernels/registry.py) that lets a test catch a run mid-impl.

The torch reference, plus two switches read from the environment at each decode call:
- ``KVB_GATE=PATH``: when the batch has ``KVB_GATE_BATCH`` sequences (any batch if unset),
  touch ``PATH.reached`` and wait while ``PATH`` exists: the test kills, interrupts or
  races the run there, or deletes ``PATH`` to let it go on.
- ``KVB_EXIT=CODE``: end the process at once with that exit code (a crashing kernel).
"""

import os
import time

from kvbench.kernels.reference import paged_decode_attention_ref, write_kv_ref

NAME = "tests.helpers.gated_kernel"  # the value for impl.kernel


def _gate(batch: int) -> None:
    gate = os.environ.get("KVB_GATE")
    want = os.environ.get("KVB_GATE_BATCH")
    if not gate or (want and int(want) != batch):
        return
    open(gate + ".reached", "w").close()
    while os.path.exists(gate):
        time.sleep(0.02)


def decode(q, k_cache, v_cache, block_tables, context_lens, scale, out=None):
    if code := os.environ.get("KVB_EXIT"):
        os._exit(int(code))
    _gate(q.shape[0])
    res = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale)
    return res if out is None else out.copy_(res)


def write(key, value, k_cache, v_cache, slot_mapping):
    write_kv_ref(key, value, k_cache, v_cache, slot_mapping)
