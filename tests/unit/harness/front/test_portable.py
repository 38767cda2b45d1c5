"""Hydra's records hold no machine paths: a published folder names nobody's checkout or home."""

from pathlib import Path

from omegaconf import OmegaConf

from kvbench.harness.front.portable import portable, portable_path

REPO = Path("/srv/ci/kvbench")


def test_paths_inside_the_checkout_become_relative():
    assert portable_path("/srv/ci/kvbench", REPO, home="/home/ann") == "."
    assert portable_path("/srv/ci/kvbench/results/cpu/service/3", REPO, home="/home/ann") == "results/cpu/service/3"
    assert portable_path("file:///srv/ci/kvbench/conf", REPO, home="/home/ann") == "file://conf"


def test_home_becomes_tilde_and_siblings_stay_whole():
    assert portable_path("/home/ann/ckpt/llama", REPO, home="/home/ann") == "~/ckpt/llama"
    assert portable_path("/srv/ci/kvbench2/x", REPO, home="/home/ann") == "/srv/ci/kvbench2/x"
    assert portable_path("/home/annette/x", REPO, home="/home/ann") == "/home/annette/x"
    assert portable_path("paged", REPO, home="/home/ann") == "paged"


def test_a_config_keeps_its_interpolations_and_loses_its_paths():
    node = OmegaConf.create({"hydra": {"runtime": {"cwd": str(REPO), "config_sources": [{"path": f"{REPO}/conf"}]},
                                       "sweep": {"dir": "results/${kvbench_slug:}/service"}},
                             "batch": 8})
    out = portable(node, REPO, home="/home/ann")
    text = OmegaConf.to_yaml(out)
    assert str(REPO) not in text
    assert out.hydra.runtime.cwd == "." and out.hydra.runtime.config_sources[0].path == "conf"
    assert OmegaConf.to_container(out, resolve=False)["hydra"]["sweep"]["dir"] == "results/${kvbench_slug:}/service"
    assert out.batch == 8
