"""harness.report.service_plots: one legend over every panel's impls, and KV-over-time panels that each have
their own time axis (an arrival process and a clock per panel)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from kvbench.harness.report.palette import figure_problems, legend_labels
from kvbench.harness.report.service_plots import chosen_runs, kv_over_time, normalized_latency

ENV = {"status": "ok", "device_slug": "cpu-test", "model": "m", "workload": "chat", "dtype": "float32", "batch": 32}


def rate_rows(impls: tuple[str, ...], clock: str, gpu: str | None) -> list[dict]:
    return [{**ENV, "scenario": "decode" if clock == "wall" else "capacity", "impl": impl, "arrival": "poisson",
             "request_rate": r, "clock": clock, "gpu": gpu, "normalized_latency_s": 0.01 * r * (k + 1),
             "run_dir": f"{clock}/{impl}/{r}"} for k, impl in enumerate(impls) for r in (1.0, 2.0, 4.0)]


def test_normalized_latency_legend_names_the_impls_of_every_panel():
    """The old legend was the last panel's: the simulated panels' Orca lines had no name."""
    rows = pd.DataFrame(rate_rows(("contiguous", "orca_pow2", "orca_oracle", "paged_torch"), "simulated", "1x a100")
                        + rate_rows(("contiguous", "paged_torch", "paged_cuda"), "wall", None))
    fig = normalized_latency(rows, {})
    assert len(fig.axes) == 2
    assert {"orca_pow2", "orca_oracle", "paged_cuda", "contiguous", "paged_torch"} <= set(legend_labels(fig))
    assert figure_problems(fig) == []
    assert not any("?" in ax.get_title() for ax in fig.axes)  # the wall-clock panel names no simulated GPU
    plt.close(fig)


def run(run_dir: str, impl: str, arrival: str, rate: float | None, seconds: float, batch: int = 32,
        backend: str = "torch") -> tuple[dict, pd.DataFrame]:
    row = {**ENV, "scenario": "decode", "run_dir": run_dir, "impl": impl, "arrival": arrival, "request_rate": rate,
           "batch": batch, "kernel_backend": backend, "clock": "wall", "budget_kv_bytes": 9e6}
    t = np.linspace(0, seconds, 30)
    steps = pd.DataFrame({"run_dir": run_dir, "impl": impl, "t_s": t, "kv_used_bytes": 4e6 + 1e6 * np.sin(t),
                          "kv_reserved_bytes": 8e6})
    return row, steps


def service_setting() -> tuple[pd.DataFrame, pd.DataFrame]:
    runs = [run("poisson/c/10", "contiguous", "poisson", 10.0, 6.0), run("poisson/c/45", "contiguous", "poisson", 45.0, 3.0),
            run("poisson/p/45", "paged_torch", "poisson", 45.0, 3.4),
            run("burst/c/8", "contiguous", "burst", None, 1.2, batch=8), run("burst/c/32", "contiguous", "burst", None, 0.9),
            run("burst/p/32", "paged_torch", "burst", None, 1.0),
            run("burst/t/8", "paged_triton", "burst", None, 78.0, batch=8, backend="triton-interpreter")]
    return pd.DataFrame([r for r, _ in runs]), pd.concat([s for _, s in runs], ignore_index=True)


def test_kv_over_time_panels_per_arrival_process_and_clock_each_on_its_own_time_axis():
    rows, steps = service_setting()
    fig = kv_over_time(steps, rows, {})
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 3
    assert "poisson arrivals, 45 req/s" in titles[0] and "wall clock" in titles[0]  # arrivals over time first
    assert "burst" in titles[1] and "B=32" in titles[1] and "wall clock" in titles[1]
    assert "Triton interpreter" in titles[2] and "B=8" in titles[2]
    right = [ax.get_xlim()[1] for ax in fig.axes]
    assert right[0] < 4 and right[1] < 1.5 and right[2] > 70  # the 3 s runs are not squeezed beside the 78 s one
    assert {"contiguous", "paged_torch", "paged_triton", "reserved", "holding token states"} <= set(legend_labels(fig))
    assert figure_problems(fig) == []
    plt.close(fig)


def test_kv_over_time_takes_the_batch_most_impls_ran_then_each_ones_highest_rate():
    rows, steps = service_setting()
    chosen = chosen_runs(steps, rows).set_index(["arrival", "timebase", "impl"])["run_dir"].to_dict()
    assert chosen == {("poisson", "wall", "contiguous"): "poisson/c/45", ("poisson", "wall", "paged_torch"): "poisson/p/45",
                      ("burst", "wall", "contiguous"): "burst/c/32", ("burst", "wall", "paged_torch"): "burst/p/32",
                      ("burst", "Triton interpreter", "paged_triton"): "burst/t/8"}


def test_past_the_panel_limit_the_wall_clocks_panels_stay_and_simulated_ones_go():
    sims = [{**r, "model": f"sim-{k}"} for k in range(7)
            for r in rate_rows(("contiguous", "paged_torch"), "simulated", "1x a100")]
    wall = [{**r, "model": "zz-tiny", "scenario": "profile"}  # a validating profile job's wall runs
            for r in rate_rows(("contiguous", "paged_cuda"), "wall", None)]
    fig = normalized_latency(pd.DataFrame(sims + wall), {})
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert len(titles) == 6 and "zz-tiny" in titles[0]
    plt.close(fig)
