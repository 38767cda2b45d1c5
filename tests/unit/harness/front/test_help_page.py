"""harness/front/help_page.py: the ``--help`` page rendered without Hydra, and when it leaves the page to Hydra.

The page itself is compared with Hydra's own in tests/jobs/test_help_page.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.harness.front.help_page import app_config_groups, help_option, help_page, scenario_names
from kvbench.harness.paths import CONF_DIR
from kvbench.harness.scenarios import schemas


def small_conf(tmp_path: Path, template: str, config: str = "defaults:\n  - override hydra/help: mine\n") -> Path:
    """A conf/ with two groups (one nested), Hydra's own folder, and a help page of its own."""
    conf = tmp_path / "conf"
    for path in ("model/tiny.yaml", "model/big.yaml", "impl/paged.yaml", "impl/cuda/fast.yaml", "hydra/launcher/x.yaml"):
        (conf / path).parent.mkdir(parents=True, exist_ok=True)
        (conf / path).write_text("{}\n")
    (conf / "traces").mkdir()
    (conf / "traces" / "trace.jsonl").write_text("")  # no yaml: not a group
    (conf / "config.yaml").write_text(config)
    (conf / "hydra" / "help").mkdir(parents=True)
    (conf / "hydra" / "help" / "mine.yaml").write_text("template: |\n" + "".join(f"  {ln}\n" for ln in template.splitlines()))
    return conf


def test_the_groups_are_conf_s_and_the_scenario_registry_sorted(tmp_path):
    conf = small_conf(tmp_path, "x")
    scenarios = ", ".join(sorted(schemas()))
    assert app_config_groups(conf) == (f"impl: paged\nimpl/cuda: fast\nmodel: big, tiny\nscenario: {scenarios}\n")


def test_the_scenario_options_are_the_registrys():
    assert scenario_names() == set(schemas())


def test_the_template_is_filled_and_a_dollar_kept(tmp_path):
    conf = small_conf(tmp_path, "Usage: kvbench\n$APP_CONFIG_GROUPS\neval \"$$(kvbench -sc install=bash)\"")
    page = help_page(conf)
    assert page is not None and page.startswith("Usage: kvbench\nimpl: paged\n")
    assert page.endswith('eval "$(kvbench -sc install=bash)"\n')


@pytest.mark.parametrize("template", [
    "$APP_CONFIG_GROUPS\n$CONFIG",  # the composed config: only Hydra has it
    "$FLAGS_HELP",
    "costs 5$",  # a stray $: Hydra's substitute raises, as here
    "${hydra.job.name}",  # an interpolation resolves against the composed config
])
def test_a_page_only_hydra_can_render_is_left_to_hydra(tmp_path, template):
    assert help_page(small_conf(tmp_path, template)) is None


@pytest.mark.parametrize("config", [
    "defaults:\n  - _self_\n",  # no help option chosen: Hydra's default page
    "defaults:\n  - override hydra/help: absent\n",  # an option that is not a file of conf/ (a package's)
    "defaults:\n  - override hydra/help: mine\nhydra:\n  help:\n    template: other\n",  # set over the option
])
def test_a_help_not_wholly_in_conf_is_left_to_hydra(tmp_path, config):
    assert help_page(small_conf(tmp_path, "$APP_CONFIG_GROUPS", config)) is None


def test_kvbench_s_config_chooses_its_own_page():
    assert help_option(CONF_DIR) == "kvbench" and help_page(CONF_DIR) is not None
