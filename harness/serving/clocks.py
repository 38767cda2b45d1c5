"""Which clock prices a simulated run: a measured profile (``clock_profile=``), else the roofline of
``gpu=NAME``, else none (bookkeeping alone). Rows name it in ``clock_source``: the profile's id, or
``roofline-vN`` with the formula's version (harness/serving/cost_model.py), so a row says which
formula priced it.

A profile prices only the setting that measured it: its record (harness/serving/profile_table.py
``Provenance``) must name the run's model, dtype, KV store, kernel and device, or the run is refused in
one line naming each difference, then and now; ``clock_profile_allow_mismatch=true`` prices with it
anyway and the row's notes name the differences. The device a simulated run prices is ``gpu=NAME``'s
GPU when it names one (its roofline prices the rest of the run), else the machine the run is on.
"""

from __future__ import annotations

import functools
import re

from kvbench.harness.config import Config, ImplConfig
from kvbench.harness.errors import ConfigError
from kvbench.harness.measure.fingerprint import Fingerprint
from kvbench.harness.serving.cost_model import ROOFLINE_VERSION, CostModel, cost_model_for
from kvbench.harness.serving.profile_table import Provenance, load_profile, provenance_of, shown
from kvbench.harness.serving.profiled_clock import ProfiledClock

ROOFLINE = f"roofline-v{ROOFLINE_VERSION}"
ALLOW = "clock_profile_allow_mismatch=true"
# The settings a profile must share with the run it prices: each changes every step's time.
MATCHED = ("model", "dtype", "kv_dtype", "kv_scale", "kernel")


def step_clock(cfg: Config, impl: ImplConfig | str) -> tuple[ProfiledClock | CostModel | None, str | None]:
    """(clock, its name for the rows): a profile's id, ``roofline``, or (None, None). ``impl``: the impl the run
    prices, or its name alone (then its kernel is known only where the config names that impl)."""
    if cfg.clock_profile is not None:
        name = impl.name if isinstance(impl, ImplConfig) else impl
        profiled = cfg.clock_profile_impl or name
        clock, made_by, table = load_profile(cfg.clock_profile, profiled)
        clock.notes = provenance_notes(cfg, name, _kernel(cfg, impl), profiled, made_by, table)
        if cfg.gpu is not None:  # the roofline prices the shapes the profile did not measure
            clock.fallback = cost_model_for(cfg)
        return clock, clock.id
    if cfg.gpu is not None:
        return cost_model_for(cfg), ROOFLINE
    return None, None


def _kernel(cfg: Config, impl: ImplConfig | str) -> str | None:
    """The run's kernel: the impl's, or, given a name alone, the config's impl's of that name (None: unknown, as
    for a name alone when the job runs every impl: only harness/front loads an impl's file)."""
    if isinstance(impl, ImplConfig):
        return impl.kernel
    return cfg.impl.kernel if cfg.impl is not None and cfg.impl.name == impl else None


@functools.cache
def this_machine(device: str) -> Fingerprint:
    """The machine and code the run is on, as its rows' fingerprint names them (one process: one of each)."""
    from kvbench.harness.measure.fingerprint import collect

    return collect(device)


def _words(text: str | None) -> set[str]:
    """``NVIDIA H100 80GB HBM3`` -> {nvidia, h100, 80gb, hbm3}: the words conf/gpu/'s ``match`` lists name."""
    return {t for t in re.split(r"[^a-z0-9]+", (text or "").lower()) if t}


@functools.cache
def _known_gpus() -> tuple[frozenset[str], ...]:
    """The ``match`` words of every conf/gpu/ file."""
    from omegaconf import OmegaConf

    from kvbench.harness.paths import CONF_DIR

    return tuple(frozenset(str(w).lower() for w in OmegaConf.load(p).get("match") or ())
                 for p in sorted((CONF_DIR / "gpu").glob("*.yaml")))


def names_gpu(made_by: Provenance, match: list[str]) -> bool:
    """Whether the profile's device is the GPU whose ``match`` words are given: all of them in its name (or
    slug), and no conf/gpu/ file naming it with more words (``h100 pcie`` is not ``h100``, the SXM part)."""
    words = {str(w).lower() for w in match}
    found = _words(made_by.device_name) | _words(made_by.device_slug)
    if not words or not words <= found:
        return False
    return all(len(other) <= len(words) for other in _known_gpus() if other and other <= found)


def differences(cfg: Config, made_by: Provenance, now: Provenance) -> list[tuple[str, str | None, str]]:
    """(setting, then, now) of each setting the profile was measured on that differs from the run's (a kernel
    the run does not know, None, is not compared)."""
    known = [k for k in MATCHED if k != "kernel" or now.kernel is not None]
    out = [(k, getattr(made_by, k), getattr(now, k)) for k in known if getattr(made_by, k) != getattr(now, k)]
    if cfg.gpu is not None:
        if not names_gpu(made_by, list(cfg.gpu.match)):
            out.append(("device", made_by.device_slug, f"gpu={cfg.gpu.name}"))
    elif made_by.device_slug != now.device_slug:
        out.append(("device", made_by.device_slug, now.device_slug))
    return out


def _said(diffs: list[tuple[str, str | None, str | None]]) -> str:
    return ", ".join(f"{k} {shown(then or 'unrecorded', quote=False)} (this run: {now or 'none'})"
                     for k, then, now in diffs)


def provenance_notes(cfg: Config, impl: str, kernel: str | None, profiled: str, made_by: Provenance | None,
                     source: str) -> tuple[str, ...]:
    """The row's notes on what measured the profile of ``impl`` (running ``kernel``); a profile of other settings
    is refused (one line, naming the table's file ``source``) unless ``clock_profile_allow_mismatch``.
    ``profiled``: the impl whose rows price the run (clock_profile_impl's)."""
    allow = cfg.clock_profile_allow_mismatch
    if made_by is None:
        # Refused: a profile made before the record says nothing of the model, dtype, kernel or device that
        # measured it, and pricing a run from an unknown one is the silent wrong figure the record exists to stop
        # (a tiny-llama CPU profile priced a llama-3.1-70b run, status ok). Measuring again is one
        # scenario=profile run; a user who knows where the table came from says so with one key.
        if not allow:
            raise ConfigError(f"clock_profile={source} records no provenance (made before kvbench recorded the "
                              "model, dtype, KV store, kernel and device that measured a profile): measure it "
                              f"again with scenario=profile, or set {ALLOW} to price with it anyway")
        unchecked = "clock_profile records no provenance: its model, dtype, KV store, kernel and device unchecked"
        return (f"{unchecked} ({ALLOW})",)
    here = this_machine(cfg.device.name)
    now = provenance_of(cfg, kernel, here.device_slug, here.gpu_name or here.cpu_name, here.git_sha)
    diffs = differences(cfg, made_by, now)
    notes = []
    if profiled != impl:  # clock_profile_impl asked for another impl's profile: its kernel comes with it
        kernels = [d for d in diffs if d[0] == "kernel"]
        diffs = [d for d in diffs if d[0] != "kernel"]
        notes.append(f"priced by impl {shown(profiled, quote=False)}'s profile (clock_profile_impl)"
                     + (f": {_said(kernels)}" if kernels else ""))
    if diffs and not allow:
        raise ConfigError(f"clock_profile={source} was measured on other settings than this run: {_said(diffs)}; "
                          f"measure this setting with scenario=profile, or set {ALLOW} to price with it anyway")
    if diffs:
        notes.append(f"clock_profile measured on other settings: {_said(diffs)} ({ALLOW})")
    if made_by.git_sha != now.git_sha:  # code moves on: a note, never a refusal
        notes.append(f"clock_profile measured at kvbench {_short(made_by.git_sha)} (this run: {_short(now.git_sha)})")
    return tuple(notes)


def _short(sha: str | None) -> str:
    return ",".join(shown(s[:12], quote=False) for s in sha.split(",")) if sha else "an unrecorded commit"


def outside_note(clock) -> str | None:
    """The row's notes on its clock: what a profile's provenance leaves to say (``provenance_notes``), and the
    steps it priced beyond the shapes it measured."""
    notes = list(getattr(clock, "notes", ()))
    outside = getattr(clock, "outside", 0)
    how = "by the roofline of gpu=NAME" if getattr(clock, "fallback", None) is not None else "its end segments extended"
    if outside:
        notes.append(f"{outside} steps priced outside the profile's batches, contexts or prefill sizes ({how})")
    return " | ".join(notes) or None
