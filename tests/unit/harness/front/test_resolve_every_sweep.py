"""Every sweep in conf/sweep/ composes and validates (first value of each swept key)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from harness.front.resolve import resolve
from tests.conftest import REPO_ROOT

SWEEPS = sorted(p.stem for p in (REPO_ROOT / "conf" / "sweep").glob("*.yaml"))


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_composes_and_resolves(compose, name):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from harness.measure.fingerprint import auto_device_slug, register_slug_resolver
    from harness.front.sweeper import register_sweep_folder_resolver

    register_slug_resolver()  # as the CLI does at start-up
    register_sweep_folder_resolver()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base=None):
        full = hydra_compose("config", overrides=[f"+sweep={name}"], return_hydra_config=True)
        params = OmegaConf.to_container(full.hydra.sweeper.params)
        # conf/hydra/sweep_results.yaml: results/<slug>/<the name less its device prefix>, as `make sweep` says
        assert full.hydra.sweep.dir == f"results/{auto_device_slug()}/{name.split('_', 1)[1]}"
        assert OmegaConf.to_container(full.hydra.sweep)["subdir"] == "${hydra.job.num}"  # one folder per job
    firsts = [f"{k}={str(v).split(',')[0]}" for k, v in params.items()]
    cfg = resolve(compose([f"+sweep={name}", *firsts]))
    assert cfg.impl is not None
