"""The human report: ``results/<dataset>/report.md`` with plots in ``plots/``.

Built only from ``trials.csv`` and ``best_config.json``, so
``python -m raytune_loader.report results/<dataset>`` rebuilds it without re-running
anything. The same inputs give a byte-identical ``report.md``; every file is written
atomically. Parameter importance uses Optuna's PED-ANOVA, which needs no scikit-learn
and has no randomness, so it is as reproducible as the rest of the report.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from raytune_loader.candidates.config import CONFIG_KEYS, LABELS, LoaderConfig
from raytune_loader.candidates.structure import structure
from raytune_loader.engines import config_from_settings, engine_named
from raytune_loader.engines.dataloader import DataLoaderEngine
from raytune_loader.errors import ConfigError, last_line
from raytune_loader.files import atomic_write_text
from raytune_loader.measuring.records import FAILED
from raytune_loader.outputs.console import (
    freeze_at_exit,
    limit_line,
    median_of,
    noisy_line,
    pipeline_line,
    refused,
    summary_rows,
)
from raytune_loader.outputs.plots import MEMORY_PLOT, PLOTS, write_memory_plot, write_plots
from raytune_loader.outputs.reader import load_best_config

ORDERED = ("num_workers", "prefetch_factor", "batch_size")  # integers, ordered for importance


# the columns every trials.csv this tool wrote has had, older ones too
NEEDED_COLUMNS = ("trial_id", "status", "pin_memory", "persistent_workers", "prefetch_factor")


def load_trials(path: Path) -> pd.DataFrame:
    """trials.csv in completion order, numbered from 1, with ``prefetch`` 0 when unused; a
    ConfigError in one line for a file this tool did not write."""
    try:
        trials = pd.read_csv(path, dtype={"trial_id": str, "reason": str, "baseline": str})
        missing = [c for c in NEEDED_COLUMNS if c not in trials]
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ConfigError(f"{path} cannot be read ({last_line(exc)}); re-run the search") from None
    if missing:
        raise ConfigError(
            f"{path} lacks {', '.join(missing)}; it is not a raytune_loader trials.csv"
        )
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
    """A trial's :func:`~raytune_loader.candidates.structure.structure` in words (older
    files lack the pipeline's columns: PIL, float32, processes; a trial without a
    configuration is ``unknown``)."""
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


def shown_keys(engines: Any) -> list[str]:
    """The configuration's columns for tables whose rows run ``engines`` (their names):
    each engine's own (:attr:`~raytune_loader.engines.base.Engine.columns`), the
    DataLoader's where none is named (an older file)."""
    names = {name for name in engines if isinstance(name, str)} or {DataLoaderEngine.name}
    shown = {k for name in names for k in engine_named(name).columns}
    return [k for k in CONFIG_KEYS if k in shown]


def _winner(best: dict[str, Any]) -> list[str]:
    rows_ = summary_rows(best)
    keys = shown_keys(r["engine"] for r in rows_)
    header = ["config", *(LABELS[k] for k in keys), "samples/s"]
    header += ["range", "util", "data wait", "first batch (s)", "tuned speedup", "steady"]
    rows = [
        [r["config"], *(_cell(r[k]) for k in keys), _cell(r["samples_per_s"])]
        + [r["samples_per_s_range"] or "-", _cell(r["util"], "pct")]
        + [_cell(r["data_wait_frac"], "pct"), _cell(r["first_batch_s"])]
        + [_cell(r["tuned_speedup"], "x"), _cell(r["steady"])]
        for r in rows_
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
        settings = config_from_settings(r).label()
        lines.append(f"- {r['name']}: {settings}; {objective} {median} ({low}-{high})")
    return lines


def _measured(best: dict[str, Any], trials: pd.DataFrame) -> list[str]:
    """How every figure was measured: the steady window, and what it marked or refused."""
    rule = best["metrics"].get("steady_rule")
    if not rule:  # an older best_config.json
        return []
    lines = ["", "## How it was measured", ""]
    lines.append(
        "Each figure is a window's rate once the loader is steady, the slower of what the "
        "training loop consumed and what the workers produced (each batch stamped with its "
        f"worker's time to make it). Steady: {rule}."
    )
    unsteady = sum(1 for v in trials.get("steady", []) if v is False)
    beyond = sum(1 for v in trials.get("bounds", []) if isinstance(v, str) and v.strip())
    lines.append("")
    lines.append(
        f"{unsteady} of {len(trials)} trials had a window that was not steady (ranked "
        f"after the steady ones); {beyond} measured above the ceiling beyond noise "
        "(a measurement defect: not ranked)."
    )
    lines += [f"- {name}: a verification run left out: {why}" for name, why in refused(best)]
    noisy = noisy_line(best)
    return lines + ([f"- {noisy[0].upper()}{noisy[1:]}."] if noisy else [])


def _efficiency(best: dict[str, Any]) -> list[str]:
    eff = median_of(best["metrics"], "efficiency")
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
    said = limit_line(limit, bool(best.get("what_if")))
    return lines + [f"{said}.", "", *_table(["", "samples/s"], rows)]


def _calibrated(model: dict[str, Any]) -> str:
    """How the trials calibrated the model, by the part that set their pace, where they
    changed it."""
    found = model.get("calibration")
    if isinstance(found, (int, float)) and found != 1.0:  # a development version's one factor
        return f"; the predictions scaled by {found:.2f}"
    if not isinstance(found, dict) or all(f == 1.0 for f in found.values()):
        return ""
    parts = ", ".join(f"{bound} {factor:.2f}" for bound, factor in sorted(found.items()))
    raw = model.get("uncalibrated_median_error")
    before = f"; the profile's alone {_cell(raw, 'pct')}" if raw is not None else ""
    return (f"; each prediction calibrated by what the trials that the same part bounded "
            f"measured of the profile's: {parts}{before}")  # fmt: skip


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
        "in the plot above and in `trials.csv`)" + _calibrated(model) + ".",
        f"- {model.get('skipped', 0)} proposals were not run: {model.get('skip_rule', '')} "
        f"(the margin was {_cell(model.get('margin'), 'pct')}).",
    ]
    what_if = best.get("what_if")
    if what_if and what_if.get("nodes"):
        pools = "actors" in what_if["nodes"][0]  # a Ray Data winner: bigger pools of actors
        keys = ("actors", "remote_cpus") if pools else ("cores", "workers_per_rank")
        rows = [[_cell(n[keys[0]]), _cell(n[keys[1]]), _estimate(n), n["bound"]]
                for n in what_if["nodes"]]  # fmt: skip
        bigger = "the pool of actors were bigger" if pools else "the node were bigger"
        lines += ["", f"What if {bigger} ({what_if['note']}; "
                  f"{_estimates_ceiling(what_if, best)}):", ""]  # fmt: skip
        head = ["actors", "remote CPUs"] if pools else ["usable CPUs", "workers per rank"]
        lines += _table([*head, "samples/s (estimate)", "what sets the pace"], rows)
    return lines


def _estimate(node: dict[str, Any]) -> str:
    """An estimate's cell; beside it the measured rate, on the row of what was measured."""
    measured = node.get("measured_samples_per_s")
    shown = _cell(node["samples_per_s"])
    return f"{shown} (measured {_cell(measured)})" if measured else shown


def _estimates_ceiling(what_if: dict[str, Any], best: dict[str, Any]) -> str:
    """The ceiling the estimates start from (the one measured before the search), and the
    search's final one where verification measured it higher."""
    first = what_if.get("ceiling_samples_per_s")
    final = (best.get("metrics") or {}).get("ceiling_samples_per_s")
    said = f"they start from the ceiling measured before the search, {_cell(first)} samples/s"
    if first and final and final > first * 1.01:
        said += f"; verification measured it at {_cell(final)}, the ceiling of every figure above"
    return said


def _trainer(best: dict[str, Any]) -> list[str]:
    """For a search tuned for a trainer's own loader: its arguments, what was left out,
    and the profile's estimate of what that cost."""
    found = best.get("trainer")
    if not found:
        return []
    arguments = ", ".join(f"{k}={v!r}" for k, v in found["training_arguments"].items())
    left_out = "; ".join(found["left_out"])
    lines = [
        "", "## Tuned for the Hugging Face Trainer", "",
        f"`TrainingArguments(..., {arguments})`: `tuned.training_arguments()`.", "",
        f"Left out, as its DataLoader cannot take them: {left_out}.",
    ]  # fmt: skip
    left = found.get("best_left_out")
    if not left:
        return [*lines, "", "Nothing outside that reach is predicted faster (or no profile)."]
    return [
        *lines, "",
        f"The cost model's fastest configuration outside that reach, {left['settings']}, is "
        f"predicted at {left['predicted_samples_per_s']:.0f} samples/s, "
        f"{left['predicted_gain']:.2f}x the tuned one (an estimate from the profile, not a "
        "measurement): what `tuned.dataloader()` in a loop of your own could add.",
    ]  # fmt: skip


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


def _importance(trials: pd.DataFrame, objective: str) -> list[str]:
    found = param_importances(trials, objective)
    lines = ["", "## Which parameters mattered", ""]
    if found is None:
        return lines + ["Not enough finished trials with varying settings to rank parameters."]
    rows = [[p, f"{v:.2f}"] for p, v in found.items()]
    text = f"Optuna's PED-ANOVA importance for `{objective}`, over the finished trials:"
    return lines + [text, "", *_table(["parameter", "importance"], rows)]


def _all_trials(trials: pd.DataFrame) -> list[str]:
    engines = trials.get("engine", ())
    # older files lack the pipeline's columns
    known = [k for k in shown_keys(engines) if k in trials]
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
    best = load_best_config(out_dir / "best_config.json").data
    trials = load_trials(out_dir / "trials.csv")
    objective = best["objective"]
    write_plots(trials, objective, out_dir / "plots")
    series = ((best.get("watch") or {}).get("memory") or {}).get("series")
    if series:
        write_memory_plot(series, out_dir / "plots" / MEMORY_PLOT)
    lines = _intro(best, trials) + _winner(best) + _measured(best, trials)
    lines += _efficiency(best) + _limit(best) + _trainer(best)
    lines += _findings(best)
    lines += ["", "## Plots"]
    for name, caption in PLOTS.items():
        lines += ["", f"![{caption}](plots/{name})"]
    lines += _how_proposed(best) + _importance(trials, objective) + _all_trials(trials) + [""]
    path = out_dir / "report.md"
    atomic_write_text(path, "\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m raytune_loader.report``: rebuild ``report.md`` in a results folder; the exit
    status."""
    freeze_at_exit()
    parser = argparse.ArgumentParser(prog="python -m raytune_loader.report", description=__doc__)
    parser.add_argument("results", type=Path, help="a results/<dataset> folder")
    args = parser.parse_args(argv)
    if args.results.is_file():
        print(f"error: {args.results} is a file; pass the results folder that holds it "
              f"({args.results.parent})", file=sys.stderr)  # fmt: skip
        return 2
    missing = [n for n in ("best_config.json", "trials.csv") if not (args.results / n).exists()]
    searched = sorted(str(f.parent) for f in args.results.glob("*/best_config.json"))
    if missing and searched:  # the --out root, which holds a folder per dataset
        print(f"error: {args.results} holds the results of each dataset; pass one of "
              f"those folders: {', '.join(searched)}", file=sys.stderr)  # fmt: skip
        return 2
    if missing:
        print(
            f"error: {args.results} has no {', '.join(missing)}; run the search first",
            file=sys.stderr,
        )
        return 2
    try:
        print(write_report(args.results))
    except ConfigError as exc:  # a file of the folder this tool did not write
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
