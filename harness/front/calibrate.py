"""``kvbench calibrate RESULT.json [RESULT.json ...] gpu=NAME model=NAME [gpu.count=N] [engine=vllm_v1] [dtype=...]
[weight_dtype=...] [kv_dtype=...] [--out conf/engine/NAME.yaml] [--holdout-every 3] [--cap 300] [--rounds 3]``
(or ``python -m harness.front.calibrate ...``).

Fits an engine profile (conf/engine/, harness/serving/engine_profile.py) to a user's own ``vllm bench serve
--save-result`` files: their figures become points (harness/front/calibrate_points.py), every k-th is held out, and
``frontend_ms``, ``step_overhead_us`` and ``seq_overhead_us`` are fitted to the others on the simulated clock
(harness/front/calibrate_fit.py; each file priced by kvbench's own command line, harness/front/calibrate_price.py).
The engine's other figures stay the base profile's. Prints, per point, the published figure, the clock's before and
after and their errors, and the median |error| of the fit and the holdout points before and after; writes the base
profile with the fitted constants, each with a comment naming the files and the errors (default
conf/engine/ENGINE_calibrated.yaml: ``engine=ENGINE_calibrated`` then prices with it). Exit 0 when the profile was
written, 2 for a bad argument or file.
"""

from __future__ import annotations

import datetime
import statistics
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from kvbench.harness.console import USAGE_ERROR, OneLineParser
from kvbench.harness.errors import ConfigError
from kvbench.harness.front.calibrate_fit import Fit, fit, relative_errors
from kvbench.harness.front.calibrate_points import Run, Setup, read_result, split_points
from kvbench.harness.front.calibrate_price import FITTED, Pricer, fmt
from kvbench.harness.front.clock_check_price import DEFAULT_CAP
from kvbench.harness.paths import CONF_DIR
from kvbench.harness.serving.engine_profile import DEFAULT_ENGINE, EngineSpec

PROG = "kvbench calibrate"
KEYS = ("gpu", "gpu.count", "model", "engine", "dtype", "weight_dtype", "kv_dtype")  # key=value words
REQUIRED = ("gpu", "model")


def _parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[1])
    p.add_argument("words", nargs="+", metavar="RESULT.json|KEY=VALUE",
                   help=f"vllm bench serve result files, and {', '.join(k + '=' for k in KEYS)} "
                        f"({' and '.join(REQUIRED)} required)")
    p.add_argument("--out", type=Path, default=None, help="the profile to write (default "
                                                           "conf/engine/ENGINE_calibrated.yaml)")
    p.add_argument("--holdout-every", type=int, default=3, help="hold every k-th point out of the fit (0: none)")
    p.add_argument("--cap", type=int, default=DEFAULT_CAP, help="most requests simulated per file")
    p.add_argument("--rounds", type=int, default=3, help="most linearize-and-solve rounds of the fit")
    return p


def _conf_names(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _named(group: str, name: str) -> str:
    if name not in _conf_names(group):
        raise ConfigError(f"{group}={name!r}: no conf/{group}/{name}.yaml; allowed: {', '.join(_conf_names(group))}")
    return name


def parse_words(words: list[str]) -> tuple[list[Path], dict[str, str]]:
    """The result files and the ``key=value`` settings; an unknown or missing key names the allowed ones."""
    files, settings = [], {}
    for w in words:
        key, eq, value = w.partition("=")
        if eq and not Path(w).is_file():
            if key not in KEYS:
                raise ConfigError(f"{w!r}: unknown key {key!r}; allowed: {', '.join(KEYS)}")
            settings[key] = value
        else:
            files.append(Path(w))
    missing = [k for k in REQUIRED if not settings.get(k)]
    if missing:
        raise ConfigError(f"{', '.join(k + '=NAME' for k in missing)} required: the files do not say where or what "
                          f"they ran (gpu: {', '.join(_conf_names('gpu'))})")
    if not files:
        raise ConfigError("no result file named: give one or more `vllm bench serve --save-result` JSON files")
    return files, settings


def setup_of(settings: dict[str, str]) -> Setup:
    count = settings.get("gpu.count", "1")
    if not count.isdigit() or int(count) < 1:
        raise ConfigError(f"gpu.count={count!r}: allowed: a whole number >= 1")
    return Setup(gpu=_named("gpu", settings["gpu"]), model=_named("model", settings["model"]), gpu_count=int(count),
                 dtype=settings.get("dtype", "bfloat16"), weight_dtype=settings.get("weight_dtype", ""),
                 kv_dtype=settings.get("kv_dtype", ""))


def base_constants(engine: str) -> tuple[Path, dict[str, float]]:
    """The base profile's file and its FITTED constants, checked as the clock checks them (EngineSpec)."""
    path = CONF_DIR / "engine" / f"{_named('engine', engine)}.yaml"
    conf = OmegaConf.to_container(OmegaConf.load(path))
    figures = {k: conf.get(k) for k in EngineSpec.field_names() if k in conf}
    missing = [k for k in FITTED if figures.get(k) is None]
    if missing:
        raise ConfigError(f"{path}: {', '.join(missing)} not set; a base profile must give each fitted constant")
    EngineSpec(**figures)
    return path, {k: float(figures[k]) for k in FITTED}


def medians(errors: np.ndarray, splits: list[str], split: str) -> float | None:
    chosen = [abs(e) for e, s in zip(errors, splits) if s == split]
    return 100 * statistics.median(chosen) if chosen else None


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def table(runs: list[Run], before: np.ndarray, after: np.ndarray) -> tuple[str, dict[str, tuple]]:
    """The per-point table and the medians {split: (before, after, points)} of |relative error|."""
    points = [p for run in runs for p in run.points]
    pub = np.array([p.value for p in points])
    eb, ea = relative_errors(before, pub), relative_errors(after, pub)
    width = max(len(p.id) for p in points)
    lines = [f"{'point':<{width}}  split    {'published':>10} {'before':>10} {'after':>10} {'err before':>10} "
             f"{'err after':>10}"]
    for p, b, a, xb, xa in zip(points, before, after, eb, ea):
        lines.append(f"{p.id:<{width}}  {p.split:<7}  {p.value:>10.4g} {b:>10.4g} {a:>10.4g} {100 * xb:>+9.1f}% "
                     f"{100 * xa:>+9.1f}%")
    splits = [p.split for p in points]
    summary = {s: (medians(eb, splits, s), medians(ea, splits, s), splits.count(s)) for s in ("fit", "holdout")}
    for s, (mb, ma, n) in summary.items():
        lines.append(f"median |error|, {s} ({n} points): {_pct(mb)} before, {_pct(ma)} after")
    return "\n".join(lines), summary


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, width=118, initial_indent="# ", subsequent_indent="#   ")


def profile_text(base_text: str, name: str, fitted: dict[str, float], notes: dict[str, str],
                 header: str) -> str:
    """The base profile's text with ``name``, the fitted values and a comment of its own above each of them
    (the base's comment, which names the base value's source, is dropped with the value)."""
    out: list[str] = []
    done = set()
    for line in base_text.splitlines():
        key = line.partition(":")[0] if line and line[0] not in "# " else None
        if key in fitted or key == "name":
            while out and out[-1].startswith("#"):
                out.pop()
        if key in fitted:
            out += _comment(notes[key]) + [f"{key}: {fmt(fitted[key])}"]
            done.add(key)
        elif key == "name":
            out += _comment(header) + [f"name: {name}"]
        else:
            out.append(line)
    for key in fitted:  # a base profile that inherits a constant: written all the same
        if key not in done:
            out += _comment(notes[key]) + [f"{key}: {fmt(fitted[key])}"]
    return "\n".join(out) + "\n"


def write_profile(out: Path, base: Path, engine: str, files: list[Path], setup: Setup, start: dict[str, float],
                  found: Fit, summary: dict[str, tuple]) -> None:
    fitted = {k: float(v) for k, v in zip(FITTED, found.theta)}
    errors = "; ".join(f"{s} points ({n}): median |error| {_pct(b)} -> {_pct(a)}" for s, (b, a, n) in summary.items())
    where = f"gpu={setup.gpu} gpu.count={setup.gpu_count} model={setup.model}"
    names = ", ".join(f.name for f in files)
    day = datetime.date.today().isoformat()
    header = (f"{out.stem}: {engine} calibrated by `kvbench calibrate` on {day} to {len(files)} vllm bench serve "
              f"result file(s) ({where}); the figures not fitted are {engine}'s, with their sources in "
              f"conf/engine/{engine}.yaml.")
    notes = {k: f"{k}: fitted ({fmt(start[k])} in {engine}) by `kvbench calibrate` to {names} ({where}); {errors}."
             for k in FITTED}
    text = profile_text(base.read_text(), out.stem, fitted, notes, header)
    conf = OmegaConf.to_container(OmegaConf.create(text))  # what was written loads, and holds a valid profile
    EngineSpec(**{k: conf[k] for k in EngineSpec.field_names() if k in conf and k != "name"}, name=out.stem)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


def calibrate(files: list[Path], settings: dict[str, str], out: Path | None, every: int, cap: int,
              rounds: int, echo=print) -> Path:
    """The whole command (module docstring); returns the profile written."""
    if cap < 1 or rounds < 1:
        raise ConfigError(f"--cap={cap} --rounds={rounds}: allowed: integers >= 1")
    setup = setup_of(settings)
    engine = settings.get("engine", DEFAULT_ENGINE)
    base, start = base_constants(engine)
    runs = split_points([read_result(f, setup) for f in files], every)
    points = [p for run in runs for p in run.points]
    fit_at = [j for j, p in enumerate(points) if p.split == "fit"]
    if not fit_at:
        raise ConfigError(f"--holdout-every={every}: no point left to fit; allowed: 0 or an integer >= 2")
    out = out or CONF_DIR / "engine" / f"{engine}_calibrated.yaml"
    pricer = Pricer(runs, engine, cap)
    t0 = time.monotonic()
    echo(f"{PROG}: {len(points)} points from {len(files)} files ({len(fit_at)} fit, {len(points) - len(fit_at)} "
         f"holdout); fitting {', '.join(FITTED)} of engine={engine} on gpu={setup.gpu} model={setup.model}")
    theta0 = [start[k] for k in FITTED]
    found = fit(lambda thetas: np.array(pricer.values(thetas, fit_at)), theta0,
                [points[j].value for j in fit_at], rounds)
    before, after = (np.array(v) for v in pricer.values([theta0, found.theta], range(len(points))))
    text, summary = table(runs, before, after)
    echo(text)
    for k, v in zip(FITTED, found.theta):
        echo(f"{k}: {fmt(start[k])} -> {fmt(v)}")
    steps = " -> ".join(f"({', '.join(fmt(v) for v in theta)}) {100 * err:.1f}%" for theta, err in found.trail)
    echo(f"search ({', '.join(FITTED)}; mean |error| of the fit points): {steps}")
    write_profile(out, base, engine, files, setup, start, found, summary)
    echo(f"{PROG}: {pricer.simulations} simulations in {time.monotonic() - t0:.0f} s; wrote {out}")
    if out.resolve().parent == (CONF_DIR / "engine").resolve():
        echo(f"price with it: engine={out.stem}")
    else:  # only conf/engine/ is a config group: the same constants on the command line
        echo(f"price with it: engine={engine} " + " ".join(f"engine.{k}={fmt(v)}" for k, v in zip(FITTED, found.theta)))
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        files, settings = parse_words(args.words)
        calibrate(files, settings, args.out, args.holdout_every, args.cap, args.rounds)
    except ConfigError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return USAGE_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
