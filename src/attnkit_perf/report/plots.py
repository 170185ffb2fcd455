"""Plots of one benchmark run: where time and memory go as the sequence grows.

Every figure has one panel row per *slice* — the shape without its sequence length and batch
(dtype, head dim, causal, heads), since the perf grid may scale the batch with N to keep work
per launch comparable — and one column per pass. Lines are backends, in the same colour in
every figure. Importing this module needs matplotlib (the ``report`` extra).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: CI runners have no display

import matplotlib.pyplot as plt

from attnkit_perf.report.data import Measurement

#: Fixed colours so a backend looks the same in every figure and every report.
BACKEND_COLOURS = {
    "triton": "tab:blue",
    "sdpa-flash": "tab:orange",
    "sdpa-cudnn": "tab:green",
    "sdpa-efficient": "tab:red",
    "sdpa-math": "tab:brown",
    "tiled": "tab:purple",
    "naive": "tab:gray",
}
PLOTTED_PASSES = ("fwd", "bwd")
SPEEDUP_REFERENCES = {"sdpa-flash": "-", "sdpa-cudnn": "--"}
#: Fewer rows than this many slices keeps each panel readable; the rest are in the tables.
MAX_SLICES = 4

Slice = tuple[tuple[str, object], ...]


def slice_of(m: Measurement) -> Slice:
    return tuple(sorted((k, v) for k, v in m.shape.items() if k not in ("seq_len", "batch")))


def slice_label(s: Slice) -> str:
    dims = dict(s)
    heads = dims.get("q_heads")
    if dims.get("kv_heads") not in (None, heads):
        heads = f"{heads}/{dims['kv_heads']}kv"
    parts = [str(dims.get("dtype", "")), f"D={dims.get('head_dim')}", f"H={heads}"]
    parts.append("causal" if dims.get("causal") else "full")
    if dims.get("window"):
        parts.append("window ({}, {})".format(*dims["window"]))
    return " ".join(p for p in parts if p)


def _colour(backend: str) -> str | None:
    return BACKEND_COLOURS.get(backend)


def _backend_order(backend: str) -> tuple[int, str]:
    """Legend order: the order of :data:`BACKEND_COLOURS`, then any other backend by name."""
    order = list(BACKEND_COLOURS)
    return (order.index(backend) if backend in order else len(order), backend)


def choose_slices(measurements: list[Measurement]) -> list[Slice]:
    """The slices to draw: the best-covered dtype's plain-attention slices (GQA only if it is all
    there is), most benchmarks first, at most :data:`MAX_SLICES`."""
    counts: dict[Slice, int] = defaultdict(int)
    for m in measurements:
        counts[slice_of(m)] += 1
    plain = [s for s in counts if dict(s).get("kv_heads") == dict(s).get("q_heads")] or list(counts)
    dtype_counts: dict[object, int] = defaultdict(int)
    for s in plain:
        dtype_counts[dict(s).get("dtype")] += counts[s]
    main_dtype = max(dtype_counts, key=lambda d: (dtype_counts[d], d == "bf16"), default=None)
    chosen = [s for s in plain if dict(s).get("dtype") == main_dtype]
    chosen.sort(key=lambda s: (-counts[s], str(s)))
    return sorted(chosen[:MAX_SLICES], key=str)


def _passes(measurements: list[Measurement]) -> list[str]:
    present = {m.pass_name for m in measurements}
    return [p for p in PLOTTED_PASSES if p in present] or sorted(present)


def _series(
    measurements: list[Measurement], value: Callable[[Measurement], float | None]
) -> dict[tuple[Slice, str, str], list[tuple[int, float]]]:
    """(slice, pass, backend) -> sorted (N, value); where one N has several batches, the largest
    batch wins so each line has one point per N."""
    best: dict[tuple[Slice, str, str, int], Measurement] = {}
    for m in measurements:
        key = (slice_of(m), m.pass_name, m.backend, m.seq_len)
        if key not in best or m.shape.get("batch", 0) > best[key].shape.get("batch", 0):
            best[key] = m
    series: dict[tuple[Slice, str, str], list[tuple[int, float]]] = defaultdict(list)
    for (s, p, backend, n), m in best.items():
        y = value(m)
        if y is not None:
            series[(s, p, backend)].append((n, y))
    return {k: sorted(v) for k, v in series.items()}


def _grid(rows: int, cols: int, title: str):
    fig, axes = plt.subplots(
        rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False, sharex=True, layout="constrained"
    )
    fig.suptitle(title)
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
    return fig, axes


def _save(fig, path: Path) -> None:
    handles: dict[str, object] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=min(len(handles), 6))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _per_backend_figure(measurements, slices, passes, value, ylabel, title, path, log_y=False, floor=None):
    series = _series(measurements, value)
    floors = _series(measurements, floor) if floor else {}
    fig, axes = _grid(len(slices), len(passes), title)
    for row, s in enumerate(slices):
        for col, p in enumerate(passes):
            ax = axes[row][col]
            ax.set_title(f"{p} · {slice_label(s)}", fontsize=9)
            ax.set_ylabel(ylabel)
            if log_y:
                ax.set_yscale("log")
            for (ss, pp, backend), points in sorted(series.items(), key=lambda kv: _backend_order(kv[0][2])):
                if (ss, pp) == (s, p):
                    ns, ys = zip(*points, strict=True)
                    ax.plot(ns, ys, marker="o", ms=3, label=backend, color=_colour(backend))
            floor_points = max(
                (v for (ss, pp, _), v in floors.items() if (ss, pp) == (s, p)), key=len, default=[]
            )
            if floor_points:
                ns, ys = zip(*floor_points, strict=True)
                ax.plot(ns, ys, "k:", label="floor (outputs only)")
    for ax in axes[-1]:
        ax.set_xlabel("sequence length N")
    _save(fig, path)


def _speedup_figure(measurements, slices, passes, path) -> bool:
    times = _series(measurements, lambda m: m.median_ms)
    fig, axes = _grid(1, len(passes), "Triton speed-up (reference time / Triton time; > 1: Triton is faster)")
    drawn = False
    for col, p in enumerate(passes):
        ax = axes[0][col]
        ax.set_title(p, fontsize=9)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("speed-up")
        for index, s in enumerate(slices):
            triton = dict(times.get((s, p, "triton"), []))
            for reference, style in SPEEDUP_REFERENCES.items():
                ref = dict(times.get((s, p, reference), []))
                ns = sorted(set(triton) & set(ref))
                if ns:
                    ax.plot(
                        ns,
                        [ref[n] / triton[n] for n in ns],
                        style,
                        marker="o",
                        ms=3,
                        color=f"C{index}",
                        label=f"vs {reference} · {slice_label(s)}",
                    )
                    drawn = True
    if drawn:
        _save(fig, path)
    else:
        plt.close(fig)
    return drawn


def write_plots(measurements: list[Measurement], out_dir: Path) -> list[str]:
    """Write the figures into ``out_dir``; returns the file names written (none without data)."""
    if not measurements:
        return []
    slices, passes = choose_slices(measurements), _passes(measurements)
    written = []
    _per_backend_figure(
        measurements,
        slices,
        passes,
        lambda m: m.tflops,
        "TFLOP/s",
        "Throughput per backend",
        out_dir / "tflops.png",
    )
    written.append("tflops.png")
    _per_backend_figure(
        measurements,
        slices,
        passes,
        lambda m: m.peak_bytes / 2**20 if m.peak_bytes is not None else None,
        "peak memory (MiB)",
        "Peak memory beyond the inputs (log scale): naive's O(N²) against the O(N) paths",
        out_dir / "memory.png",
        log_y=True,
        floor=lambda m: m.min_bytes / 2**20 if m.min_bytes is not None else None,
    )
    written.append("memory.png")
    if _speedup_figure(measurements, slices, passes, out_dir / "speedup.png"):
        written.append("speedup.png")
    return written
