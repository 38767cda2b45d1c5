"""kv_dtype and kv_scale are validated at the entry point, naming the allowed values; the default
(auto) leaves every existing job's identity as it was."""

from __future__ import annotations

import pytest

from kvbench.harness.errors import ConfigError
from kvbench.harness.front.resolve import resolve
from kvbench.harness.job.identity import job_id


@pytest.mark.parametrize(("override", "allowed"), [
    ("kv_dtype=fp4", "auto, fp8_e4m3, fp8_e5m2, int8"),
    ("kv_scale=block", "tensor, token_head"),
])
def test_bad_value_names_the_allowed_ones(compose, override, allowed):
    with pytest.raises(ConfigError) as e:
        resolve(compose(["model=tiny-llama", override]))
    assert override.split("=")[0] in str(e.value) and allowed in str(e.value)


def test_default_keeps_identity_and_a_quantized_cache_is_another_job(compose):
    base = resolve(compose(["model=tiny-llama", "+impl=paged_torch"]))
    explicit = resolve(compose(["model=tiny-llama", "+impl=paged_torch", "kv_dtype=auto", "kv_scale=tensor"]))
    no_scales = resolve(compose(["model=tiny-llama", "+impl=paged_torch", "kv_scale=token_head"]))
    fp8 = resolve(compose(["model=tiny-llama", "+impl=paged_torch", "kv_dtype=fp8_e4m3"]))
    fp8_heads = resolve(compose(["model=tiny-llama", "+impl=paged_torch", "kv_dtype=fp8_e4m3", "kv_scale=token_head"]))
    assert no_scales.kv_scale == "tensor"  # auto stores floats: kv_scale means nothing there
    ids = [job_id(c, "cpu") for c in (base, explicit, no_scales, fp8, fp8_heads)]
    assert ids[0] == ids[1] == ids[2] and len(set(ids[2:])) == 3
