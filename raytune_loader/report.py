"""The human report: ``results/<dataset>/report.md`` with plots in ``plots/``.

Built only from ``trials.csv`` and ``best_config.json``, so
``python -m raytune_loader.report results/<dataset>`` rebuilds it without re-running
anything. The same inputs give a byte-identical ``report.md``; every file is written
atomically. Parameter importance uses Optuna's PED-ANOVA, which needs no scikit-learn
and has no randomness, so it is as reproducible as the rest of the report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from raytune_loader.errors import ConfigError
from raytune_loader.records import MEASURED
from raytune_loader.results import atomic_write_text, config_from_sections
from raytune_loader.space import CONFIG_KEYS, LABELS, LoaderConfig, structure

FAILED = ("failed", "error")
MARKERS = "osD^vP*Xph"
ORDERED = ("num_workers", "prefetch_factor", "batch_size")  # integers, ordered for importance


def summary_rows(best: dict[str, Any]) -> list[dict[str, Any]]:
    """Winner and both baselines: the table a user pastes into a pull request. Each row
    has every field of the configuration (its DataLoader arguments and pipeline)."""
    sections = {"tuned": best, **best["baselines"]}
    winner_speed = _median(best["metrics"], "samples_per_s")
    out = []
    for name, section in sections.items():
        metrics = section["metrics"]
        config = config_from_sections(
            section["loader"], section.get("pipeline"), section.get("worker_init")
        )
        speed = _median(metrics, "samples_per_s")
        out.append(
            {
                "config": name,
                **config.values(),
                "samples_per_s": speed,
                "samples_per_s_range": _range(metrics, "samples_per_s"),
                "util": _median(metrics, "util"),
                "data_wait_frac": _median(metrics, "data_wait_frac"),
                "first_batch_s": _median(metrics, "first_batch_s"),
                "tuned_speedup": (winner_speed / speed) if speed and winner_speed else None,
                "steady": metrics.get("steady"),
            }
        )
    return out


def _median(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return value.get("median") if isinstance(value, dict) else value


def _range(metrics: dict[str, Any], key: str) -> str:
    value = metrics.get(key)
    if not isinstance(value, dict):
        return ""
    return f"{value['min']:.0f}-{value['max']:.0f}"


def load_trials(path: Path) -> pd.DataFrame:
    """trials.csv in completion order, numbered from 1, with ``prefetch`` 0 when unused."""
    trials = pd.read_csv(path, dtype={"trial_id": str, "reason": str, "baseline": str})
    if "finished_at" in trials:  # older files lack it; their rows are already in order
        trials = trials.sort_values("finished_at", kind="stable")
    trials = trials.reset_index(drop=True)
    trials.insert(0, "trial", range(1, len(trials) + 1))
    for flag in ("pin_memory", "persistent_workers"):
        trials[flag] = trials[flag].map(lambda v: str(v).strip().lower() == "true")
    if "steady" in trials:  # True, False, or empty where a window was too short to tell
        trials["steady"] = [_flag(v) for v in trials["steady"]]
    trials["prefetch"] = trials["prefetch_factor"].fillna(0).astype(int)
    trials["structure"] = [structure_of(row) for row in trials.to_dict("records")]
    return trials


def _halves(row: dict[str, Any]) -> str:
    """A trial's window: its halves' ratio, and whether that was steady."""
    return _cell(row.get("steady_ratio")) + (" (not steady)" if row.get("steady") is False else "")


def _flag(value: Any) -> bool | None:
    if value is None or (not isinstance(value, str) and pd.isna(value)) or value == "":
        return None
    return str(value).strip().lower() == "true"


def structure_of(row: dict[str, Any]) -> str:
    """A trial's :func:`~raytune_loader.space.structure` in words (older files lack the
    pipeline's columns: PIL, float32, processes; a trial without a configuration is
    ``unknown``)."""
    known = {k: _plain(row[k]) for k in CONFIG_KEYS if k in row and not _missing(row[k])}
    try:
        config = LoaderConfig.from_trial_config(known)
    except (ConfigError, TypeError, ValueError):
        return "unknown"
    return structure(config).words()


def _missing(value: Any) -> bool:
    return value is None or (not isinstance(value, str) and pd.isna(value))


def _plain(value: Any) -> Any:
    """A CSV cell as the configuration's type: 2.0 is 2, "True" is True."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value in ("True", "False"):
        return value == "True"
    return value


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


def param_importances(trials: pd.DataFrame, objective: str) -> dict[str, float] | None:
    """PED-ANOVA importance over finished trials of the parameters that vary; None if too few."""
    import optuna

    done = trials[(trials["status"] == "ok") & trials[objective].notna()]
    done = done.assign(prefetch_factor=done["prefetch"])  # 0 for workers=0: one fixed range
    known = [p for p in CONFIG_KEYS if p in done]  # older files lack the pipeline's columns
    done = done.assign(**{p: done[p].astype(object).where(done[p].notna(), "default").astype(str)
                          for p in known if p not in ORDERED})  # fmt: skip
    varying = [p for p in known if done[p].nunique() > 1]
    if len(done) < 2 or not varying:
        return None
    dists = {p: _distribution(done[p]) for p in varying}
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ExperimentalWarning, small-sample notes
            study = optuna.create_study(direction="maximize")
            for params, value in zip(
                done[varying].to_dict("records"), done[objective], strict=True
            ):
                trial = optuna.trial.create_trial(params=params, distributions=dists, value=value)
                study.add_trial(trial)
            evaluator = optuna.importance.PedAnovaImportanceEvaluator()
            found = optuna.importance.get_param_importances(study, evaluator=evaluator)
    finally:
        optuna.logging.set_verbosity(verbosity)
    return {p: float(found[p]) for p in sorted(found, key=lambda p: (-found[p], p))}


def _distribution(values: pd.Series) -> Any:
    """Worker and prefetch counts are ordered integers; the rest are plain choices."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    choices = sorted(values.unique().tolist())
    if values.name in ORDERED:
        return IntDistribution(choices[0], choices[-1])
    return CategoricalDistribution(choices)


def _save_png(fig: Figure, path: Path) -> None:
    """Write without a timestamp or version stamp, then rename into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
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
            handles.append(_handle(marker, "grey", f"pin {_cell(pin)}, batch {batch}"))
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
    axes[-1].set_xlabel("num_workers (loader processes)")
    style.legend(fig, "prefetch {}")
    _save_png(fig, path)


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


def _cell(value: Any, kind: str = "") -> str:
    """One Markdown cell: ``pct``/``pct1`` as a percentage, ``x`` a speedup, numbers compact."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return "-"
    if kind in ("pct", "pct1"):
        return f"{100 * value:.{kind[3:] or 0}f}%"
    if kind == "x":
        return f"{value:.2f}x"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.0f}" if value.is_integer() or abs(value) >= 10 else f"{value:.3g}"
    return " ".join(str(value).split()).replace("|", "\\|")[:80]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _intro(best: dict[str, Any], trials: pd.DataFrame) -> list[str]:
    counts = trials["status"].value_counts()
    failed = sum(int(counts.get(s, 0)) for s in FAILED)
    hw, wall = best.get("hardware", {}), best.get("search", {}).get("wall_time_s")
    gpus = hw.get("gpu_count") or 0
    gpu = f"{gpus} x {hw['gpu_name']}" if gpus > 1 else hw.get("gpu_name") or "no GPU"
    return [
        f"# DataLoader search: {best['dataset']} / {best['model']}",
        "",
        f"Objective: maximise `{best['objective']}`. {len(trials)} trials: "
        f"{counts.get('ok', 0)} finished, {counts.get('stopped_early', 0)} stopped early, "
        f"{failed} failed, in {_cell(wall)} s of wall time. Hardware: "
        f"{hw.get('cpu_model', '?')}, {hw.get('usable_cpus', '?')} usable CPUs, {gpu}.",
    ]


def _winner(best: dict[str, Any]) -> list[str]:
    header = ["config", *LABELS.values(), "samples/s"]
    header += ["range", "util", "data wait", "first batch (s)", "tuned speedup", "steady"]
    rows = [
        [r["config"], *(_cell(r[k]) for k in CONFIG_KEYS), _cell(r["samples_per_s"])]
        + [r["samples_per_s_range"] or "-", _cell(r["util"], "pct")]
        + [_cell(r["data_wait_frac"], "pct"), _cell(r["first_batch_s"])]
        + [_cell(r["tuned_speedup"], "x"), _cell(r["steady"])]
        for r in summary_rows(best)
    ]
    sel, objective = best.get("selection", {}), best["objective"]
    how = (
        f"Cost decided: `{sel.get('best_by_objective')}` had the best objective, and the winner "
        "is within noise of it but cheaper"
        if sel.get("decided_by_cost")
        else "The winner also has the best verified objective"
    )
    lines = ["", "## Verified winner vs the usual choices", "", *_table(header, rows), ""]
    rule = sel.get("rule", "?")
    lines.append(f"The winner (`{sel.get('chosen', '?')}`) was chosen by the rule: {rule}. {how}.")
    lines += ["", "Runners-up:", ""] if sel.get("runners_up") else []
    kind = "pct1" if objective == "util" else ""
    for r in sel.get("runners_up", []):
        median, low, high = (_cell(r["objective"].get(k), kind) for k in ("median", "min", "max"))
        settings = config_from_sections(r["loader"], r.get("pipeline"), r.get("worker_init"))
        settings = settings.label()
        lines.append(f"- {r['name']}: {settings}; {objective} {median} ({low}-{high})")
    return lines


def _measured(best: dict[str, Any], trials: pd.DataFrame) -> list[str]:
    """How every figure was measured: the steady window, and what it marked or refused."""
    rule = best["metrics"].get("steady_rule")
    if not rule:  # an older best_config.json
        return []
    lines = ["", "## How it was measured", ""]
    lines.append(
        "Each figure is a window's rate once the loader is steady: the window starts after "
        "the warm-up steps and as many more batches as the configuration holds in flight, "
        "and its rate is the slower of what the training loop consumed and what the "
        f"workers produced (each batch stamped with its worker's time to make it). Steady: {rule}."
    )
    unsteady = sum(1 for v in trials.get("steady", []) if v is False)
    beyond = sum(1 for v in trials.get("bounds", []) if isinstance(v, str) and v.strip())
    lines.append("")
    lines.append(
        f"{unsteady} of {len(trials)} trials had a window that was not steady (ranked "
        f"after the steady ones); {beyond} measured above the ceiling beyond noise "
        "(a measurement defect: not ranked)."
    )
    sections = {"tuned": best, **best.get("baselines", {})}
    for name, section in sections.items():
        for reason in section["metrics"].get("refused", []):
            lines.append(f"- {name}: a verification run left out: {reason}")
    return lines


def _efficiency(best: dict[str, Any]) -> list[str]:
    eff = _median(best["metrics"], "efficiency")
    ceiling = best["metrics"].get("ceiling_samples_per_s")
    note = best["metrics"].get("ceiling_note")
    text = (
        f"Efficiency is not reported: {note}."
        if note
        else (
            f"The tuned loader reaches {_cell(eff, 'pct')} of the speed of a perfect loader "
            f"(ceiling {_cell(ceiling)} samples/s: the model fed batches already in memory)."
            if eff is not None and ceiling is not None
            else "The speed of a perfect loader (the ceiling) is unknown, so efficiency is unknown."
        )
    )
    return ["", "## Efficiency against the ceiling", "", text]


def limit_line(limit: dict[str, Any] | None) -> str | None:
    """Where the limit is, from best_config.json's ``limit`` section."""
    if not limit:
        return None
    alone, trained = limit["input_samples_per_s"], limit["trained_samples_per_s"]
    core = f"one core decodes and augments {limit['per_core_samples_per_s']:.0f} samples/s"
    if limit["bound"] == "defect":
        return (
            f"defect: training {limit['defect']}; the input pipeline alone delivered "
            f"{alone:.0f} samples/s, and nothing trains faster than its input"
        )
    if limit["bound"] == "input":
        return (
            f"input-bound: the input pipeline delivers at most {alone:.0f} samples/s "
            f"(training took {trained:.0f}; {core})"
        )
    return (
        f"model-bound: the loader has {limit['headroom']:.0%} headroom (the input pipeline "
        f"alone delivers {alone:.0f} samples/s, training took {trained:.0f}; {core})"
    )


_DECODES = {
    "pil": "decoded by PIL in the workers",
    "tensor": "decoded to tensors in the workers",
    "device": "decoded on the device (nvJPEG)",
}


def pipeline_line(pipeline: dict[str, Any]) -> str:
    """The tuned pipeline in words: ``uint8 transfer (normalized on the device), ...``."""
    decode = pipeline.get("decode", "pil")
    transfer = (
        "uint8 transfer (normalized on the device)"
        if pipeline.get("transfer") == "uint8"
        else "float32 transfer (normalized in the workers)"
    )
    if decode == "device":
        transfer = "JPEG bytes transferred"
    kind = "thread workers" if pipeline.get("workers") == "thread" else "process workers"
    order = "in order" if pipeline.get("in_order", True) else "out of order"
    start = pipeline.get("start_method", "default")
    where = f"{kind}, {order}" + (f", start method {start}" if kind == "process workers" else "")
    if pipeline.get("access") == "stream":
        made = "in the workers" if pipeline.get("batching") == "workers" else "by the loader"
        where += f", read as a stream, batches made {made}"
    return f"{_DECODES.get(decode, decode)}, {transfer}, {where}"


def _limit(best: dict[str, Any]) -> list[str]:
    """Where the limit is: the tuned pipeline, and its input alone beside training and
    the ceiling."""
    lines = ["", "## Where the limit is", ""]
    if best.get("pipeline"):
        lines += [f"Tuned pipeline: {pipeline_line(best['pipeline'])}.", ""]
    limit = best.get("limit")
    if not limit:
        return lines + ["The input pipeline alone was not measured."]
    ceiling = best["metrics"].get("ceiling_samples_per_s")
    rows = [
        ["input pipeline alone (no model)", _cell(limit["input_samples_per_s"])],
        ["trained (verified median)", _cell(limit["trained_samples_per_s"])],
        ["ceiling (model on a resident batch)", _cell(ceiling)],
        ["worker-side stages on one core", _cell(limit["per_core_samples_per_s"])],
    ]
    return lines + [f"{limit_line(limit)}.", "", *_table(["", "samples/s"], rows)]


def _how_proposed(best: dict[str, Any]) -> list[str]:
    """How the search proposed trials; for the model-guided search, how well the model
    predicted them, what it skipped, and its estimates for bigger nodes."""
    search = best.get("search", {})
    method = search.get("method", "tpe")
    lines = ["", "## How the search proposed", ""]
    if method != "model" or "model" not in search:
        return lines + [f"`--search {method}`: {search.get('sampler', method)}."]
    model = search["model"]
    profile = model.get("profile", {})
    error = model.get("model_median_error")
    lines += [
        f"`--search model`: a {_cell(profile.get('seconds'))} s profile of each structure's "
        "stages, a cost model predicting every candidate from it, the predicted best of "
        "each structure first, then TPE around them.",
        "",
        f"- The model's median error over {model.get('predictions', 0)} finished trials: "
        f"{_cell(error, 'pct') if error is not None else 'unknown'} (predicted beside measured "
        "in the plot above and in `trials.csv`).",
        f"- {model.get('skipped', 0)} proposals were not run: {model.get('skip_rule', '')} "
        f"(the margin was {_cell(model.get('margin'), 'pct')}).",
    ]
    what_if = best.get("what_if")
    if what_if and what_if.get("nodes"):
        rows = [[str(n["cores"]), str(n["workers_per_rank"]), _cell(n["samples_per_s"]),
                 n["bound"]] for n in what_if["nodes"]]  # fmt: skip
        lines += ["", f"What if the node were bigger ({what_if['note']}; the ceiling is "
                  f"{_cell(what_if.get('ceiling_samples_per_s'))} samples/s):", ""]  # fmt: skip
        lines += _table(["usable CPUs", "workers per rank", "samples/s (estimate)",
                         "what sets the pace"], rows)  # fmt: skip
    return lines


MEMORY_PLOT = "memory.png"


def _findings(best: dict[str, Any]) -> list[str]:
    """The findings (each with its figure, projection and fix), what was watched in the
    tuned configuration's runs, and the plot of its memory against samples read."""
    lines = ["", "## Findings", ""]
    found = best.get("findings")
    if found is None:
        return lines + ["This result was written before findings were watched."]
    for finding in found:
        lines.append(f"- **{finding['kind']}**: {finding['figure']}.")
        projection = finding.get("projection")
        if projection:
            lines.append(
                f"  Projection: {_mib(projection['total_bytes'])} MiB after one epoch of "
                f"{projection['epoch_samples']:,} samples (now {_mib(projection['current_bytes'])} "
                f"MiB; {_mib(projection['free_bytes'])} MiB free, share "
                f"{_cell(projection['memory_share'], 'pct')})."
            )
        lines.append(f"  Fix: {finding['fix']}.")
    if not found:
        lines.append("None: memory growth, worker threads, stragglers and epoch starts were "
                     "watched and none reached its threshold.")  # fmt: skip
    watch = best.get("watch") or {}
    if not watch:
        return lines
    rows = _watch_rows(watch)
    lines += ["", f"Watched in the tuned configuration's {watch.get('runs', '?')} verification "
              "runs (medians):", "", *_table(["", "value"], rows)]  # fmt: skip
    if (watch.get("memory") or {}).get("series"):
        caption = "Memory against samples read (the tuned configuration, one run)"
        lines += ["", f"![{caption}](plots/{MEMORY_PLOT})"]
    return lines


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


def _watch_rows(watch: dict[str, Any]) -> list[list[str]]:
    starts, wait = watch.get("epoch_start_s") or {}, watch.get("data_wait") or {}
    memory, threads = watch.get("memory") or {}, watch.get("threads") or {}
    growth = memory.get("growth_per_sample_bytes")
    pools = ", ".join(f"{p['library']} {p['threads']}" for p in threads.get("pools") or [])
    return [
        ["first batch (s)", _cell(watch.get("first_batch_s"))],
        ["epoch start with persistent workers (s)", _cell(starts.get("persistent"))],
        ["epoch start without (s)", _cell(starts.get("fresh"))],
        ["a step's wait for its batch, p50 (ms)", _cell(_ms(wait.get("p50_s")))],
        ["a step's wait for its batch, p99 (ms)", _cell(_ms(wait.get("p99_s")))],
        ["window lost to waits above twice the median", _cell(wait.get("tail_frac"), "pct1")],
        ["memory growth per sample read (KiB)",
         _cell(None if growth is None else growth / 2**10)],
        [f"one epoch ({_cell(memory.get('epoch_samples'))} samples) adds (MiB)",
         _mib(memory.get("epoch_growth_bytes"))],
        ["the measurement's processes hold (MiB)", _mib(memory.get("watched_bytes"))],
        ["the node's free memory (MiB)", _mib(memory.get("free_bytes"))],
        ["busy threads per worker process", _cell(threads.get("busy_per_worker"))],
        ["threads per worker process", _cell(threads.get("per_worker"))],
        ["thread pools the workers inherit", pools or "-"],
        ["watching's own cost (share of one CPU while it watched)",
         _cell((watch.get("cost") or {}).get("share_of_one_cpu"), "pct1")],
    ]  # fmt: skip


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _plot_memory(series: dict[str, Any], path: Path) -> None:
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


def _importance(trials: pd.DataFrame, objective: str) -> list[str]:
    found = param_importances(trials, objective)
    lines = ["", "## Which parameters mattered", ""]
    if found is None:
        return lines + ["Not enough finished trials with varying settings to rank parameters."]
    rows = [[p, f"{v:.2f}"] for p, v in found.items()]
    text = f"Optuna's PED-ANOVA importance for `{objective}`, over the finished trials:"
    return lines + [text, "", *_table(["parameter", "importance"], rows)]


def _all_trials(trials: pd.DataFrame) -> list[str]:
    known = [k for k in CONFIG_KEYS if k in trials]  # older files lack the pipeline's columns
    header = ["#", "trial", "status", "reason", "baseline", *(LABELS[k] for k in known)]
    header += ["effective batch", "OOM back-offs", "samples/s", "first batch (s)", "util"]
    header += ["data wait", "efficiency", "halves"]
    keys = ["trial", "trial_id", "status", "reason", "baseline", *known]
    keys += ["effective_batch_size", "oom_backoffs", "samples_per_s", "first_batch_s"]
    hosts = ["hostname"] if trials.get("hostname", pd.Series()).nunique() > 1 else []
    rows = [
        [_cell(row.get(k)) for k in keys]
        + [_cell(row.get(k), "pct") for k in ("util", "data_wait_frac", "efficiency")]
        + [
            _cell(row.get("steady_ratio"))
            + ("" if row.get("steady") is not False else " (not steady)")
        ]
        + [_cell(row[k]) for k in hosts]
        for row in trials.astype(object).to_dict("records")
    ]
    return ["", "## All trials (completion order)", "", *_table(header + hosts, rows)]


def write_report(out_dir: Path) -> Path:
    """(Re)build report.md and its plots from the files in ``out_dir``."""
    best = json.loads((out_dir / "best_config.json").read_text())
    trials = load_trials(out_dir / "trials.csv")
    objective = best["objective"]
    write_plots(trials, objective, out_dir / "plots")
    series = ((best.get("watch") or {}).get("memory") or {}).get("series")
    if series:
        _plot_memory(series, out_dir / "plots" / MEMORY_PLOT)
    lines = _intro(best, trials) + _winner(best) + _measured(best, trials)
    lines += _efficiency(best) + _limit(best)
    lines += _findings(best)
    lines += ["", "## Plots"]
    for name, caption in PLOTS.items():
        lines += ["", f"![{caption}](plots/{name})"]
    lines += _how_proposed(best) + _importance(trials, objective) + _all_trials(trials) + [""]
    path = out_dir / "report.md"
    atomic_write_text(path, "\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    from raytune_loader.console import freeze_at_exit  # console imports this module

    freeze_at_exit()
    parser = argparse.ArgumentParser(prog="python -m raytune_loader.report", description=__doc__)
    parser.add_argument("results", type=Path, help="a results/<dataset> folder")
    args = parser.parse_args(argv)
    missing = [n for n in ("best_config.json", "trials.csv") if not (args.results / n).exists()]
    if missing:
        print(
            f"error: {args.results} has no {', '.join(missing)}; run the search first",
            file=sys.stderr,
        )
        return 2
    print(write_report(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
