"""An imported vLLM result needs its machine and batch to be drawn beside kvbench's rows: from the file, else
from the report's ``--external-device`` / ``--external-batch``, else one problem line saying how to give them."""

from __future__ import annotations

import json

import pytest

from kvbench.harness.report.collect import collect
from kvbench.harness.report.external import ExternalDefaults, ExternalFileError, with_run
from tests.helpers.vllm_rows import FIXTURE


def test_the_files_own_values_win_over_the_defaults():
    row = with_run({"device_slug": "gpu-a", "batch": 4}, ExternalDefaults("gpu-b", 64))
    assert (row["device_slug"], row["batch"]) == ("gpu-a", 4)
    assert with_run({}, ExternalDefaults("gpu-b", 64)) == {"device_slug": "gpu-b", "batch": 64}


@pytest.mark.parametrize("row, says", [({}, "records no device and batch"),
                                       ({"batch": 8}, "records no device,"),
                                       ({"device_slug": "gpu-a"}, "records no batch,")])
def test_what_is_missing_is_named_with_both_ways_to_give_it(row, says):
    with pytest.raises(ExternalFileError) as e:
        with_run(row, ExternalDefaults())
    assert says in str(e.value) and "--metadata" in str(e.value) and "--external-" in str(e.value)


@pytest.mark.parametrize("device, batch", [(None, 0), (None, True), ("", None), (None, 2.0)])
def test_bad_defaults_are_refused(device, batch):
    with pytest.raises(ValueError, match="external"):
        ExternalDefaults(device, batch)


def test_collect_reads_a_bare_vllm_file_with_the_defaults_and_lists_it_without(tmp_path):
    folder = tmp_path / "r" / "external" / "vllm"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(FIXTURE.read_text())
    bare = collect([tmp_path / "r"])
    assert bare.rows.empty and len(bare.problems) == 1 and "records no device and batch" in bare.problems[0].reason
    given = collect([tmp_path / "r"], ExternalDefaults("cpu-x", 16)).rows
    assert (given["device_slug"].tolist(), given["batch"].tolist()) == (["cpu-x"], [16])
    (folder / "run.json").write_text(json.dumps({**json.loads(FIXTURE.read_text()), "device": "cpu-y",
                                                 "max_concurrency": 4}))
    assert collect([tmp_path / "r"]).rows[["device_slug", "batch"]].values.tolist() == [["cpu-y", 4]]
