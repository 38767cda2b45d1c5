"""Strict config: keys the schema does not know, even added with ``+``, and a relabelled model."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from kvbench.harness.front.compose_errors import describe
from kvbench.harness.scenarios import schemas
from kvbench.harness.errors import ConfigError
from kvbench.harness.front.resolve import resolve
from kvbench.harness.front.strict import check_model_name, unknown_key_message


@pytest.mark.parametrize("override, expected", [
    ("+workload.promptlen=5", "workload.promptlen is not a config key; did you mean workload.prompt_len?"),
    ("+bach=4", "bach is not a config key; did you mean batch?"),
    ("+device.memory=2", "device.memory is not a config key; did you mean device.memory_gb?"),
    ("+impl.kernal=torch", "impl.kernal is not a config key; did you mean impl.kernel?"),
])
def test_plus_keys_the_schema_does_not_know_are_errors(compose, override, expected):
    extra = ["+impl=paged_torch"] if override.startswith("+impl.") else []
    cfg = compose([*extra, "scenario=capacity", override])
    with pytest.raises(ConfigError, match="^" + expected.replace("?", r"\?")):
        resolve(cfg)


@pytest.mark.parametrize("scenario, override, expected", [
    ("kernel", "+scenario.probe=x", "scenario.probe belongs to scenario=max_concurrency, max_rate, not scenario=kernel "
                                    "(scenario=kernel keys: name, context_len, warmup, iters, slab_block_size)"),
    ("capacity", "+scenario.warmup=0", "scenario.warmup belongs to scenario=decode, kernel, max_rate, profile, not "
                                       "scenario=capacity (scenario=capacity keys: name, concurrency_points)"),
    ("kernel", "+scenario.iter=3", "scenario.iter is not a config key; did you mean scenario.iters? (scenario=kernel keys:"),
])
def test_a_key_of_another_scenario_is_an_error_naming_the_scenarios_keys(compose, scenario, override, expected):
    cfg = compose([f"scenario={scenario}", override])
    with pytest.raises(ConfigError, match="^" + re.escape(expected)):
        resolve(cfg)


def test_a_key_of_another_scenario_does_not_compose_and_says_why(compose):
    """Without +, Hydra refuses the key while composing; the CLI and the sweeper describe it in one line."""
    from hydra.errors import HydraException

    with pytest.raises(HydraException) as e:
        compose(["scenario=kernel", "scenario.probe=x"])
    assert describe(e.value) == ("scenario.probe belongs to scenario=max_concurrency, max_rate, not scenario=kernel "
                                 "(scenario=kernel keys: name, context_len, warmup, iters, slab_block_size)")


def test_each_scenario_composes_its_own_dataclass(compose):
    for name, schema in schemas().items():
        cfg = resolve(compose([f"scenario={name}", *(["arrival=poisson", "slo=interactive"] if name == "max_rate" else [])]))
        assert type(cfg.scenario) is schema and cfg.scenario.name == name


def test_a_relabelled_scenario_is_an_error(compose):
    with pytest.raises(ConfigError, match=r"scenario.name='decode' only relabels the rows .* scenario=kernel\)"):
        resolve(compose(["scenario=kernel", "scenario.name=decode"]))


def test_the_message_lists_the_allowed_keys():
    msg = unknown_key_message("workload.zzz")
    assert msg.startswith("workload.zzz is not a config key (workload keys: name, distribution,")
    assert "did you mean" not in msg  # nothing close


def test_known_plus_keys_still_resolve(compose):
    cfg = resolve(compose(["+impl=paged_torch", "scenario=capacity", "workload.prompt_len=5"]))
    assert cfg.workload.prompt_len == 5


def test_model_name_must_match_the_chosen_option():
    cfg = OmegaConf.create({"model": {"name": "llama-2-7b", "path": None}})
    with pytest.raises(ConfigError, match=r"model.name='llama-2-7b' only relabels .* model=auto\); choose it with model=llama-2-7b"):
        check_model_name(cfg, "auto")
    check_model_name(OmegaConf.create({"model": {"name": "llama-2-7b", "path": None}}), "llama-2-7b")
    check_model_name(OmegaConf.create({"model": {"name": "auto", "path": None}}), "auto")
    # A checkpoint folder names the model itself.
    check_model_name(OmegaConf.create({"model": {"name": "x", "path": "/some/folder"}}), "auto")
    with pytest.raises(ConfigError, match=r"choose a model with model=NAME \(allowed: auto, .*tiny-llama"):
        check_model_name(OmegaConf.create({"model": {"name": "my-model", "path": None}}), "tiny-llama")
