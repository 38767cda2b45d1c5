"""StagingBuffer: a step's integer fields, packed into one buffer and copied once."""

from __future__ import annotations

import pytest
import torch

from kvbench.impls.staging import StagingBuffer


def test_fields_round_trip_in_their_dtypes():
    staging = StagingBuffer(torch.device("cpu"))
    fields = [([3, -1, 2**40], torch.int64), ([7, 8, 9], torch.int32), ([], torch.int64),
              ([-5], torch.int32), (range(4), torch.int64), ([], torch.int32)]
    handles = [staging.add(values, dtype) for values, dtype in fields]
    staging.upload()
    for handle, (values, dtype) in zip(handles, fields):
        got = staging[handle]
        assert got.dtype == dtype and got.is_contiguous() and got.tolist() == list(values)


def test_cpu_fields_are_views_of_one_buffer():
    staging = StagingBuffer(torch.device("cpu"))
    a, b = staging.add([1, 2]), staging.add([3], torch.int32)
    staging.upload()
    assert staging[a].untyped_storage().data_ptr() == staging[b].untyped_storage().data_ptr()


def test_misuse_is_named():
    staging = StagingBuffer(torch.device("cpu"))
    handle = staging.add([1])
    with pytest.raises(RuntimeError, match="upload"):
        staging[handle]
    with pytest.raises(ValueError, match="int64 or int32"):
        staging.add([1], torch.int16)
    staging.upload()
    with pytest.raises(RuntimeError, match="before upload"):
        staging.add([2])


@pytest.mark.gpu
def test_one_non_blocking_copy_to_the_gpu():
    staging = StagingBuffer(torch.device("cuda"))
    a, b = staging.add(list(range(5))), staging.add([4, 5, 6], torch.int32)
    staging.upload()
    assert staging[a].device.type == "cuda" and staging[b].dtype == torch.int32
    assert staging[a].tolist() == list(range(5)) and staging[b].tolist() == [4, 5, 6]


def test_every_field_starts_on_a_16_byte_boundary():
    """Triton specialises pointers on 16-byte alignment: an odd offset would recompile a kernel mid-run."""
    staging = StagingBuffer(torch.device("cpu"))
    values = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [10]]
    handles = [staging.add(v, dtype) for v in values for dtype in (torch.int64, torch.int32)]
    staging.upload()
    base = staging[handles[0]].data_ptr()
    for handle, (v, dtype) in zip(handles, [(v, d) for v in values for d in (torch.int64, torch.int32)]):
        field = staging[handle]
        assert (field.data_ptr() - base) % 16 == 0
        assert field.dtype == dtype and field.tolist() == v


def test_row_copies_by_block_and_by_row_equal_a_row_by_row_reference():
    """Block-aligned copy-on-write copies go by block index, others by row; both as rows would."""
    import random

    import torch

    from kvbench.impls.allocator import SlotCopy
    from kvbench.impls.base import apply_slot_copies

    rng = random.Random(0)
    for block_len in (1, 4, 16, 512):
        store = torch.randn(12, block_len, 2, 3)
        copies = [SlotCopy(5 * block_len, 9 * block_len, rng.randint(1, block_len)),  # copy-on-write
                  SlotCopy(2 * block_len + (1 if block_len > 1 else 0), 0, 1)]  # unaligned: by row
        ref = store.clone().view(-1, 2, 3)
        for c in copies:
            ref[c.dst:c.dst + c.num_slots] = ref[c.src:c.src + c.num_slots].clone()
        got = store.clone()
        apply_slot_copies([got], copies)
        flat = got.view(-1, 2, 3)
        for c in copies:  # the rows asked for match; a block copy may also bring the rest of its block
            assert torch.equal(flat[c.dst:c.dst + c.num_slots], ref[c.dst:c.dst + c.num_slots])
        untouched = [r for r in range(12 * block_len) if not (9 * block_len <= r < 10 * block_len) and r != 0]
        assert torch.equal(flat[untouched], ref[untouched])
