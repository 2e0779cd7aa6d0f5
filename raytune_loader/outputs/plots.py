"""The report's plots: PNG files drawn with matplotlib from ``trials.csv``'s rows.

:func:`write_plots` draws every plot of :data:`PLOTS` into a folder, and
:func:`write_memory_plot` the findings' memory plot; each is written without a
timestamp and renamed into place, so the same trials give the same files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from raytune_loader.files import temporary_beside
from raytune_loader.measuring.records import FAILED, MEASURED

MARKERS = "osD^vP*Xph"


def plot_points(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials that produced a measurement; stopped-early ones are flagged ``hollow``.

    Failed trials, and trials that an interrupt ended before their first report (no
    metrics, perhaps no configuration), are left out.
    """
    configured = trials[["num_workers", "batch_size"]].notna().all(axis=1)
    measured = trials["status"].isin(MEASURED) & trials["samples_per_s"].notna()
    points = trials[measured & configured].copy()
    points["hollow"] = points["status"] == "stopped_early"
    return points


def _save_png(fig: Figure, path: Path) -> None:
    """Write without a timestamp or version stamp, then rename into place."""
    fd, tmp = temporary_beside(path, ".png")
    os.close(fd)
    try:
        FigureCanvasAgg(fig).print_png(tmp, metadata={"Software": None})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _figure(title: str, rows: int = 1) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(8, 3.2 * rows + 0.6), dpi=100, layout="constrained")
    axes = list(fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0])
    axes[0].set_title(title)  # over the axes, not the figure, so the legend cannot hide it
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.margins(x=0.1, y=0.12)  # room for the baseline labels
    return fig, axes


@dataclass(frozen=True)
class _Style:
    """Colour per value of ``hue``, marker per (pin_memory, batch_size), shared by legend."""

    hue: str
    colours: dict[Any, str]
    markers: dict[tuple[Any, Any], str]

    @classmethod
    def of(cls, points: pd.DataFrame, hue: str) -> _Style:
        combos = sorted(points.groupby(["pin_memory", "batch_size"]).groups)
        colours = {v: f"C{i % 10}" for i, v in enumerate(sorted(points[hue].unique()))}
        return cls(hue, colours, {c: MARKERS[i % len(MARKERS)] for i, c in enumerate(combos)})

    def legend(self, fig: Figure, hue_label: str) -> None:
        """One legend outside the axes, so it never covers a point."""
        handles = [_handle("o", c, hue_label.format(v or "none")) for v, c in self.colours.items()]
        for (pin, batch), marker in self.markers.items():
            handles.append(_handle(marker, "grey", f"pin {'yes' if pin else 'no'}, batch {batch}"))
        handles += [_handle("o", "black", "finished"), _handle("o", "black", "stopped early", True)]
        fig.legend(handles=handles, loc="outside right upper", fontsize=8)


def _handle(marker: str, colour: str, label: str, hollow: bool = False) -> Line2D:
    face = "none" if hollow else colour
    return Line2D([], [], ls="", marker=marker, color=colour, mfc=face, label=label)


def _x(points: pd.DataFrame, x: str) -> pd.Series:
    """Spread configs that share a worker count by prefetch, so none hides another."""
    if x != "num_workers":
        return points[x]
    by_workers = points.groupby("num_workers")["prefetch"]
    centred = by_workers.rank(method="dense") - (by_workers.transform("nunique") + 1) / 2
    return points[x] + 0.07 * centred


def _scatter(ax: Axes, points: pd.DataFrame, x: str, y: str, style: _Style) -> None:
    """Draw the points, hollow if stopped early, and name the baselines beside theirs."""
    if points.empty:
        ax.text(0.5, 0.5, "no measured trials", ha="center", transform=ax.transAxes)
    xs = _x(points, x)
    for (pin, batch, hollow), part in points.groupby(["pin_memory", "batch_size", "hollow"]):
        edge = [style.colours[v] for v in part[style.hue]]
        face = "none" if hollow else edge
        marker = style.markers[(pin, batch)]
        ax.scatter(xs[part.index], part[y], s=45, marker=marker, c=face, edgecolors=edge)
    marked = points[points["baseline"].notna()].sort_values(["hollow", "trial"], kind="stable")
    for i, row in marked.groupby("baseline").head(1).iterrows():
        label = {"textcoords": "offset points", "fontsize": 8, "ha": "center", "va": "top"}
        ax.annotate(row["baseline"], (xs[i], row[y]), xytext=(0, -7), color="dimgrey", **label)


PLOTS = {
    "structures.png": "Throughput by structure, measured and as the cost model predicted",
    "throughput.png": "Throughput and utilisation against num_workers",
    "prefetch.png": "Throughput against prefetch_factor",
    "efficiency.png": "Efficiency against num_workers",
    "progress.png": "Search progress",
}


Y_LABELS = {
    "samples_per_s": "samples/s",
    "util": "accelerator utilisation (0-1)",
    "efficiency": "efficiency (1.0 = ceiling)",
}


def _plot_by_workers(points: pd.DataFrame, ys: list[str], title: str, path: Path) -> None:
    fig, axes = _figure(title, len(ys))
    style = _Style.of(points, "prefetch")
    for ax, y in zip(axes, ys, strict=True):
        _scatter(ax, points[points[y].notna()], "num_workers", y, style)
        ax.set_ylabel(Y_LABELS[y])
    if ys == ["efficiency"]:
        (ax,) = axes
        ax.axhline(1.0, color="black", ls="--", lw=1)
        ax.text(0.01, 1.01, "ceiling (a perfect loader)", transform=ax.get_yaxis_transform())
        ax.set_ylim(0, max([1.1, *(points["efficiency"].dropna() + 0.05)]))
    axes[-1].set_xticks(sorted(points["num_workers"].unique()))
    axes[-1].set_xlabel(f"num_workers ({workers_word(points)})")
    style.legend(fig, "prefetch {}")
    _save_png(fig, path)


WORKER_WORDS = {"process": "processes", "thread": "threads"}


def workers_word(points: pd.DataFrame) -> str:
    """What ``num_workers`` counts among ``points``: loader processes, threads, or either
    (a trials.csv without the ``workers`` column predates thread workers)."""
    kinds = set(points["workers"].dropna()) if "workers" in points else set()
    words = [WORKER_WORDS[k] for k in sorted(kinds) if k in WORKER_WORDS] or ["processes"]
    return f"loader {' or '.join(words)}"


def _plot_prefetch(points: pd.DataFrame, path: Path) -> None:
    fig, (ax,) = _figure("Throughput by prefetch_factor (trials with workers > 0)")
    used = points[points["num_workers"] > 0]
    style = _Style.of(used, "num_workers")
    _scatter(ax, used, "prefetch", "samples_per_s", style)
    if not used.empty:
        ticks = sorted(used["prefetch"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        style.legend(fig, "workers {}")
    ax.set_xlabel("prefetch_factor (batches queued per worker, log scale)")
    ax.set_ylabel("samples/s")
    _save_png(fig, path)


def _plot_progress(trials: pd.DataFrame, objective: str, path: Path) -> None:
    fig, (ax,) = _figure(f"Search progress: {objective} per trial and the best so far")
    for status, face in (("ok", "C0"), ("stopped_early", "none")):
        part = trials[trials["status"] == status]
        label = "finished" if status == "ok" else "stopped early"
        ax.scatter(part["trial"], part[objective], facecolors=face, edgecolors="C0", label=label)
    failed = trials[trials["status"].isin(FAILED)]
    if len(failed):
        ax.scatter(failed["trial"], [0] * len(failed), marker="x", c="C3", label="failed (as 0)")
    best = trials[objective].where(trials["status"] == "ok").cummax().ffill()
    ax.step(trials["trial"], best, where="post", color="C1", label="best finished so far")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("trial (completion order)")
    ax.set_ylabel(Y_LABELS.get(objective, objective))
    fig.legend(loc="outside right upper", fontsize=8)
    _save_png(fig, path)


def _plot_structures(points: pd.DataFrame, path: Path) -> None:
    """Samples/s against workers, a colour per structure (decoder x transfer x worker
    kind); the cost model's prediction beside each measurement, where there is one."""
    fig, (ax,) = _figure("Throughput by structure: measured (dots), predicted (crosses)")
    style = _Style.of(points, "structure")
    _scatter(ax, points, "num_workers", "samples_per_s", style)
    if "predicted_samples_per_s" in points:
        xs = _x(points, "num_workers") + 0.03
        colours = [style.colours[v] for v in points["structure"]]
        ax.scatter(xs, points["predicted_samples_per_s"], marker="x", s=30, c=colours)
    if not points.empty:
        ax.set_xticks(sorted(points["num_workers"].unique()))
    ax.set_xlabel("num_workers (per rank)")
    ax.set_ylabel("samples/s")
    style.legend(fig, "{}")
    _save_png(fig, path)


def write_plots(trials: pd.DataFrame, objective: str, plots: Path) -> None:
    """Draw every plot in ``PLOTS`` into the folder ``plots``."""
    plots.mkdir(parents=True, exist_ok=True)
    points = plot_points(trials)
    _plot_structures(points, plots / "structures.png")
    title = "Throughput and utilisation by worker count (failed trials left out)"
    _plot_by_workers(points, ["samples_per_s", "util"], title, plots / "throughput.png")
    _plot_prefetch(points, plots / "prefetch.png")
    title = "Efficiency: samples/s as a share of a perfect loader's (the ceiling)"
    _plot_by_workers(points, ["efficiency"], title, plots / "efficiency.png")
    _plot_progress(trials, objective, plots / "progress.png")


MEMORY_PLOT = "memory.png"


def write_memory_plot(series: dict[str, Any], path: Path) -> None:
    """Each process's resident anonymous memory, and the followed worker's private
    memory, against the samples the training loop had read; the window shaded."""
    fig, (ax,) = _figure("Memory against samples read (the tuned configuration, one run)")
    for i, process in enumerate(series["processes"]):
        name = "main process" if process["worker"] is None else f"worker {process['worker']}"
        mib = [b / 2**20 for b in process["anonymous_bytes"]]
        ax.plot(process["samples_read"], mib, color=f"C{i}", lw=1.2, label=f"{name}, resident")
    private = series.get("private") or {}
    if private.get("samples_read"):
        mib = [b / 2**20 for b in private["bytes"]]
        ax.plot(private["samples_read"], mib, "o--", color="black", ms=4,
                label="worker 0, private (copies and its own)")  # fmt: skip
    start, end = series["window"]
    ax.axvspan(start, end, color="grey", alpha=0.12, label="measured window")
    ax.set_xlabel("samples read by the training loop")
    ax.set_ylabel("MiB")
    fig.legend(loc="outside right upper", fontsize=8)
    _save_png(fig, path)
