"""The names users bring: vLLM's CLI keys and ``impl=`` without the ``+`` mean what they mean there."""

from __future__ import annotations

import pytest

from kvbench.harness.front.aliases import translate


@pytest.mark.parametrize("given, taken", [
    (["max_num_seqs=64"], ["batch=64"]),
    (["max_model_len=2048"], ["max_seq_len=2048"]),
    (["num_prompts=1000"], ["workload.num_requests=1000"]),
    (["gpu_memory_utilization=0.85"], ["device.utilization=0.85"]),
    (["+impl=paged", "enable_prefix_caching=false"], ["+impl=paged", "impl.prefix_caching=false"]),
    (["request_rate=inf"], ["arrival=burst"]),
    (["request_rate=8"], ["arrival=poisson", "arrival.rate=8"]),
    (["arrival=gamma", "request_rate=8"], ["arrival=gamma", "arrival.rate=8"]),  # an arrival process chosen stays
    (["impl=paged"], ["+impl=paged"]),
    (["impl=contiguous,paged_cuda"], ["+impl=contiguous,paged_cuda"]),
    (["-m", "max_num_seqs=1,8"], ["-m", "batch=1,8"]),
    (["++max_num_seqs=4"], ["++batch=4"]),
    # kvbench's own keys, Hydra's, and an impl's keys pass as written
    (["batch=4", "+impl=paged", "impl.kernel=torch", "hydra.run.dir=x", "--cfg", "job"],
     ["batch=4", "+impl=paged", "impl.kernel=torch", "hydra.run.dir=x", "--cfg", "job"]),
])
def test_aliases_become_kvbenchs_keys_with_a_note_each(given, taken):
    argv, notes = translate(given)
    assert argv == taken
    renamed = [a for a in given if a not in taken and not a.startswith("-")]
    assert len(notes) == len(renamed)
