"""harness.report.speed_plots: every impl in its own colour and marker in every panel, one legend naming all
of them, and no panel without data."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from kvbench.harness.report.palette import drawn_impls, figure_problems, impl_style, legend_labels
from kvbench.harness.report.speed_plots import OWN, decode_throughput, gpu_comparison, kernel_latency_bandwidth

BASE = {"status": "ok", "workload": "chat", "dtype": "bfloat16"}


def decode(device: str, model: str, impls: tuple[str, ...], gpu: str | None = None) -> list[dict]:
    return [{**BASE, "scenario": "decode", "device_slug": device, "gpu_name": gpu, "model": model, "impl": impl,
             "batch": b, "output_tokens_per_s": 100.0 * b * (k + 1), "run_dir": f"{device}/{impl}"}
            for k, impl in enumerate(impls) for b in (1, 8, 32)]


def kernel(device: str, impls: tuple[str, ...], gpu: str | None = None) -> list[dict]:
    rows = []
    for impl in impls:
        layouts = [("contiguous", None)] if impl == "contiguous" else [("paged", 16), ("contiguous", 16), ("paged", 128)]
        for layout, block in layouts:
            for ctx in (1024, 4096):
                rows.append({**BASE, "scenario": "kernel", "device_slug": device, "gpu_name": gpu, "impl": impl,
                             "layout": layout, "block_size": block, "kernel_batch": 16, "context_len": ctx,
                             "num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "latency_us_p50": ctx / 10,
                             "bandwidth_gbps": ctx / 2, "run_dir": f"{device}/k"})
    return rows


def _styles(fig) -> dict[str, set]:
    """Per impl, every (colour, marker) its lines are drawn in, over all panels."""
    out: dict[str, set] = {}
    for ax in fig.axes:
        for ln in ax.lines:
            if not ln.get_label().startswith("_"):
                out.setdefault(ln.get_label(), set()).add((ln.get_color(), ln.get_marker()))
    return out


def test_decode_throughput_one_style_per_impl_and_one_legend_for_all_panels():
    rows = pd.DataFrame(decode("gpu-a", "m1", ("contiguous", "paged_torch"))
                        + decode("gpu-b", "m2", ("paged_torch", "paged_cuda", "vllm")))
    fig = decode_throughput(rows, {})
    styles = _styles(fig)
    assert all(len(s) == 1 for s in styles.values())  # paged_torch looks the same in both panels
    assert len({next(iter(s)) for s in styles.values()}) == len(styles)  # and like no other impl
    assert styles["paged_torch"] == {(impl_style("paged_torch").colour, impl_style("paged_torch").marker)}
    assert set(legend_labels(fig)) >= {"contiguous", "paged_torch", "paged_cuda", "vllm"}
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    assert figure_problems(fig) == []
    plt.close(fig)


def test_gpu_comparison_leaves_out_panels_without_data_and_names_every_impl():
    """A CPU has no peak bandwidth: its normalised panels are not drawn, rather than drawn empty."""
    rows = pd.DataFrame(decode("cpu-2core", "tiny", ("contiguous", "paged_torch"))
                        + decode("nvidia-h200", "big", ("contiguous", "paged_triton"), gpu="NVIDIA H200")
                        + kernel("cpu-2core", ("contiguous", "paged_torch"))
                        + kernel("nvidia-h200", ("contiguous", "paged_triton"), gpu="NVIDIA H200"))
    fig = gpu_comparison(rows, {})
    titles = [ax.get_title() for ax in fig.axes]
    assert sum(t.startswith("cpu-2core") for t in titles) == 2 and sum(t.startswith("nvidia-h200") for t in titles) == 4
    assert figure_problems(fig) == []  # no empty panel, every impl in the legend in its own style
    assert {"contiguous", "paged_torch", "paged_triton"} <= set(legend_labels(fig))
    assert drawn_impls(fig) == {"contiguous", "paged_torch", "paged_triton"}
    # one line per impl and kernel batch: the identity-table layout and block 128 are not averaged in
    kernel_panel = next(ax for ax in fig.axes if ax.get_ylabel() == "kernel bandwidth (GB/s)")
    assert len([ln for ln in kernel_panel.lines if not ln.get_label().startswith("_")]) == 2
    plt.close(fig)


def test_kernel_figure_draws_each_impls_own_layout_solid():
    rows = pd.DataFrame(kernel("nvidia-h200", ("contiguous", "paged_cuda"), gpu="NVIDIA H200"))
    fig = kernel_latency_bandwidth(rows, {})
    lat = fig.axes[0]
    solid = {ln.get_label() for ln in lat.lines if ln.get_linestyle() == "-" and not ln.get_label().startswith("_")}
    dashed = [ln for ln in lat.lines if ln.get_linestyle() != "-" and ln.get_label() == "paged_cuda"]
    assert solid == {"contiguous", "paged_cuda"} and len(dashed) == 2  # identity table, block 128
    assert OWN in legend_labels(fig) and "peak bandwidth" in legend_labels(fig)
    assert "datasheet peak 4800 GB/s" in fig.axes[1].get_title()  # its value on the panel, not on the lines
    assert figure_problems(fig) == []
    plt.close(fig)
