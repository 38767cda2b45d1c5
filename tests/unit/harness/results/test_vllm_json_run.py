"""A vLLM result's machine, batch and workload: from ``--metadata`` (text) or vLLM's own ``max_concurrency``."""

from __future__ import annotations

import json

import pytest

from kvbench.harness.results.vllm_json import VllmJsonError, from_vllm, to_vllm
from tests.helpers.vllm_rows import FIXTURE


def _read(**change) -> dict:
    return from_vllm({**json.loads(FIXTURE.read_text()), **change})


def test_metadata_gives_device_batch_and_workload():
    row = _read(device="nvidia-h100", batch="64", workload="sharegpt")
    assert (row["device_slug"], row["batch"], row["workload"]) == ("nvidia-h100", 64, "sharegpt")


def test_vllms_max_concurrency_is_the_batch_when_no_batch_is_given():
    assert _read(max_concurrency=32)["batch"] == 32
    assert _read(max_concurrency=32, batch=16)["batch"] == 16  # the one given for kvbench wins


def test_absent_ones_stay_absent():
    row = _read()
    assert "device_slug" not in row and "batch" not in row and "workload" not in row


@pytest.mark.parametrize("change, names", [({"batch": "lots"}, "batch: expected a whole number"),
                                           ({"batch": 0}, "batch: expected a whole number of requests >= 1"),
                                           ({"max_concurrency": 2.5}, "max_concurrency: expected a whole number"),
                                           ({"device": 7}, "device: expected text")])
def test_a_wrong_value_names_its_key(change, names):
    with pytest.raises(VllmJsonError, match=names):
        _read(**change)


def test_a_kvbench_row_writes_them_for_the_import_to_read_back():
    out = to_vllm({"impl": "paged_torch", "device_slug": "cpu-a", "batch": 8, "workload": "chat",
                   "duration_s": 1.0, "achieved_rps": 1.0})
    assert (out["device"], out["batch"], out["workload"]) == ("cpu-a", 8, "chat")
