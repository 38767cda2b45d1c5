"""Every sweep in conf/sweep/ composes and validates (first value of each swept key)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from kvbench.harness.front.resolve import resolve
from tests.conftest import REPO_ROOT

SWEEPS = sorted(p.stem for p in (REPO_ROOT / "conf" / "sweep").glob("*.yaml"))


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_composes_and_resolves(compose, name):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from kvbench.harness.measure.fingerprint import auto_device_slug, register_slug_resolver
    from kvbench.harness.front.sweeper import register_sweep_folder_resolver

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


def _makefile_list(name: str) -> set[str]:
    """A ``NAME := a b \\`` list of the Makefile, continuation lines included."""
    text = (REPO_ROOT / "Makefile").read_text().replace("\\\n", " ")
    line = next(l for l in text.splitlines() if l.startswith(f"{name} :="))
    return set(line.split(":=", 1)[1].split())


def test_the_makefile_runs_side_by_side_exactly_the_bookkeeping_sweeps(compose):
    """`make sweep` runs the BOOKKEEPING sweeps several at a time: every job of each must time nothing
    on this machine (its scenario is bookkeeping only), and no such CPU sweep may be left to run alone."""
    booked = set()
    for name in (n for n in SWEEPS if n.startswith("cpu_")):
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir

        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base=None):
            params = OmegaConf.to_container(hydra_compose("config", overrides=[f"+sweep={name}"],
                                                          return_hydra_config=True).hydra.sweeper.params)
        # The first value of every swept key, then each value of a swept scenario key (the others at
        # their first value): only the scenario decides whether a job times anything.
        firsts = {k: str(v).split(",")[0] for k, v in params.items()}
        variants = [firsts] + [dict(firsts, **{k: value}) for k, v in params.items() if "scenario" in k
                               for value in str(v).split(",")]
        kinds = {resolve(compose([f"+sweep={name}", *(f"{k}={v}" for k, v in o.items())])).scenario.bookkeeping
                 for o in variants}
        assert len(kinds) == 1, f"{name}: some jobs are bookkeeping and some are timed"
        if kinds.pop():
            booked.add(name)
    assert _makefile_list("BOOKKEEPING") == booked
