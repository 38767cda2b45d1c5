"""A job's id hashes the values that differ from the committed defaults (harness/job/identity_defaults.json):
a key added with a default leaves every id as it was, a changed default or value changes it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvbench.harness.config import Config, ImplConfig, WorkloadConfig
from kvbench.harness.scenarios.decode import DecodeScenario
from kvbench.harness.job.identity import (
    SNAPSHOT, add_new_keys, identity_fields, job_id, load_snapshot, missing_keys, schema_defaults,
)
from kvbench.harness.model.config import ModelConfig, RopeScaling
from kvbench.harness.front.resolve import resolve

BASE = ["+impl=paged_torch", "model=tiny-llama", "device=cpu", "max_seq_len=128"]
SLUG = "cpu"


@pytest.fixture
def cfg(compose) -> Config:
    return resolve(compose(BASE))


def _with_fields(cls: type, **new) -> type:
    """``cls`` as if the schema had gained keys with defaults (a dataclass value: its class's default)."""
    fields = [(name, type(v), dataclasses.field(default_factory=type(v)) if dataclasses.is_dataclass(v)
               else dataclasses.field(default=v)) for name, v in new.items()]
    return dataclasses.make_dataclass(cls.__name__, fields, bases=(cls,))


def _copy_as(obj, cls: type, **values):
    return cls(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, **values)


def test_a_new_defaulted_key_leaves_the_id_unchanged(cfg):
    before = job_id(cfg, SLUG)
    # New keys at the top, in the chosen scenario, and in nested groups (whose schema default
    # is then the grown class, as it would be had the key been added to the group's dataclass).
    model = _copy_as(cfg.model, _with_fields(ModelConfig, new_flag=False))
    workload = _copy_as(cfg.workload, _with_fields(WorkloadConfig, new_name="x"))
    scenario = _copy_as(cfg.scenario, _with_fields(DecodeScenario, new_knob=0.5))
    grown = _with_fields(Config, new_knob=3, model=model, workload=workload)
    top = _copy_as(dataclasses.replace(cfg, model=model, workload=workload, scenario=scenario), grown)
    flat = dataclasses.asdict(top)
    assert flat["new_knob"] == 3 and flat["model"]["new_flag"] is False and flat["scenario"]["new_knob"] == 0.5
    # The snapshot as `python -m harness.job_identity` would grow it for this schema.
    recorded = load_snapshot()
    grown_snapshot = {**recorded, **{k: v for k, v in schema_defaults(grown).items() if k not in recorded}}
    assert {"new_knob", "model:ModelConfig.new_flag", "scenario:DecodeScenario.new_knob"} <= set(grown_snapshot)
    assert job_id(top, SLUG, grown_snapshot) == before
    # A new key set to something other than its default is a different job.
    for path, value in [(("new_knob",), 4), (("model", "new_flag"), True), (("workload", "new_name"), "y"),
                        (("scenario", "new_knob"), 1.5)]:
        assert job_id(_set(top, path, value), SLUG, grown_snapshot) != before, path


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return [*value, 7]
    raise TypeError(type(value))


def _leaves(obj, path=()):
    """(path, value) of every non-None, non-dataclass value in a dataclass, recursively."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, (*path, f.name))
        elif value is not None:
            yield (*path, f.name), value


def _set(obj, path, value):
    obj = dataclasses.replace(obj)  # a shallow copy per level: the fixture's config stays as it was
    if len(path) == 1:
        setattr(obj, path[0], value)
    else:
        setattr(obj, path[0], _set(getattr(obj, path[0]), path[1:], value))
    return obj


def test_changing_any_one_value_changes_the_id(cfg):
    before = job_id(cfg, SLUG)
    paths = [p for p, _ in _leaves(cfg) if p[0] not in ("resume", "progress")]
    assert ("batch",) in paths and ("scenario", "warmup") in paths and ("model", "hidden_size") in paths
    assert ("workload", "columns", "prompt_len") in paths
    for path, value in _leaves(cfg):
        if path[0] in ("resume", "progress"):
            continue
        assert job_id(_set(cfg, path, _changed(value)), SLUG) != before, path
    # None set to a value, and a nested dataclass where the default is None
    assert job_id(_set(cfg, ("cpu_threads",), 2), SLUG) != before
    assert job_id(_set(cfg, ("model", "rope_scaling"), RopeScaling()), SLUG) != before
    assert job_id(_set(cfg, ("impl",), ImplConfig(name="paged_torch", cache="contiguous")), SLUG) != before
    assert job_id(cfg, "cuda-h200") != before
    # The switches that change how a job runs, not what it measures, keep the id.
    assert job_id(_set(_set(cfg, ("resume",), True), ("progress",), True), SLUG) == before


def test_a_key_set_to_its_default_is_the_same_job(compose, cfg):
    explicit = resolve(compose([*BASE, "scenario.warmup=1", "workload.sigma=0.6", "model.hidden_size=256",
                                "cuda_graph=false", "workload.prompt_len=96.0"]))
    assert identity_fields(explicit, SLUG) == identity_fields(cfg, SLUG)
    assert job_id(explicit, SLUG) == job_id(cfg, SLUG)


def test_scenarios_at_their_defaults_are_different_jobs(compose):
    ids = {job_id(resolve(compose([*BASE, f"scenario={name}"])), SLUG) for name in ("decode", "kernel", "capacity")}
    assert len(ids) == 3


def test_the_identity_lists_only_what_differs_from_the_defaults(cfg):
    fields = identity_fields(cfg, SLUG)["config"]
    assert fields["scenario"] == "DecodeScenario"  # the class names the scenario; its keys are at their defaults
    assert not any(k.startswith("scenario:") for k in fields)
    assert fields["impl"] == "ImplConfig" and fields["impl:ImplConfig.name"] == "paged_torch"
    assert not any(k.startswith(("model", "arrival")) for k in fields) and "seed" not in fields  # all at defaults
    assert fields["max_seq_len"] == 128


def test_a_changed_default_changes_the_id_of_jobs_at_it(cfg):
    """The snapshot keeps each key's default as first recorded: a job at a new default is told
    apart from one measured at the old (a schema changing block_size's default from 16 to 32)."""
    at_new_default = _set(cfg, ("block_size",), 32)
    assert load_snapshot()["block_size"] == 16 and "block_size" not in identity_fields(cfg, SLUG)["config"]
    assert job_id(at_new_default, SLUG) != job_id(cfg, SLUG)


def test_the_snapshot_records_every_schema_key():
    assert missing_keys() == {}, (f"{SNAPSHOT.name} lacks {sorted(missing_keys())}: run "
                                  "`python -m harness.job_identity` and commit it (existing entries stay)")


def test_growing_the_snapshot_never_rewrites_an_entry(tmp_path):
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps({"block_size": 32, "batch": 8}))  # block_size's default "was" 32
    new = add_new_keys(path)
    grown = json.loads(path.read_text())
    assert grown["block_size"] == 32 and "batch" not in new and "dtype" in new and grown["dtype"] == "auto"


def test_a_roofline_formula_change_changes_the_ids_of_jobs_that_name_a_gpu(compose, monkeypatch):
    """ROOFLINE_VERSION (harness/serving/cost_model.py) is hashed into every job with gpu=NAME: rows a
    former formula priced are never resumed as this one's; a job without a GPU spec keeps its id."""
    import kvbench.harness.job.identity as identity

    clocked = resolve(compose(["+impl=paged_torch", "scenario=capacity", "model=llama-2-7b", "gpu=a100-40gb"]))
    bare = resolve(compose(BASE))
    assert identity_fields(clocked, SLUG)["config"]["roofline_version"] == identity.ROOFLINE_VERSION
    assert "roofline_version" not in identity_fields(bare, SLUG)["config"]
    before = job_id(clocked, SLUG), job_id(bare, SLUG)
    monkeypatch.setattr(identity, "ROOFLINE_VERSION", identity.ROOFLINE_VERSION + 1)
    assert job_id(clocked, SLUG) != before[0] and job_id(bare, SLUG) == before[1]
