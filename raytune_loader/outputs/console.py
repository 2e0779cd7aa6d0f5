"""What the command lines print: live progress, the summary table, notes; and how they
end (:func:`freeze_at_exit`).

The library reports through :class:`~raytune_loader.progress.Progress` and
returns data; only the command-line modules (:mod:`~raytune_loader.search`,
:mod:`~raytune_loader.bench`, :mod:`~raytune_loader.outputs.report`'s ``main``) print,
and the search and the bench print through this module, so both show the same
table.
"""

from __future__ import annotations

import atexit
import gc
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.engines import ENGINES, config_from_settings, engine_named
from raytune_loader.engines.dataloader import DataLoaderEngine
from raytune_loader.errors import RaytuneLoaderError, SearchInterruptedError, UserInputError
from raytune_loader.measuring.records import TrialRecord, trial_status
from raytune_loader.outputs.reader import chosen_settings
from raytune_loader.progress import Progress

WORDS = {"ok": "done", "stopped_early": "stopped early", "error": "error"}


def summary_rows(best: dict[str, Any]) -> list[dict[str, Any]]:
    """Winner and both baselines: the table a user pastes into a pull request. Each row
    has every field of the configuration (its DataLoader arguments and pipeline)."""
    sections = {"tuned": best, **best["baselines"]}
    winner_speed = median_of(best["metrics"], "samples_per_s")
    out = []
    for name, section in sections.items():
        metrics = section["metrics"]
        config = config_from_settings(_row_settings(best, name, section))
        speed = median_of(metrics, "samples_per_s")
        out.append(
            {
                "config": name,
                **config.values(),
                "samples_per_s": speed,
                "samples_per_s_range": _range(metrics, "samples_per_s"),
                "util": median_of(metrics, "util"),
                "data_wait_frac": median_of(metrics, "data_wait_frac"),
                "first_batch_s": median_of(metrics, "first_batch_s"),
                "tuned_speedup": (winner_speed / speed) if speed and winner_speed else None,
                "steady": metrics.get("steady"),
            }
        )
    return out


def _row_settings(best: dict[str, Any], name: str, section: dict[str, Any]) -> dict[str, Any]:
    """A row's settings: the chosen candidate's for the tuned row, a baseline's own."""
    return chosen_settings(best) if name == "tuned" else section


def median_of(metrics: dict[str, Any], key: str) -> float | None:
    """A recorded metric's median (a bare number as itself; None where absent)."""
    value = metrics.get(key)
    return value.get("median") if isinstance(value, dict) else value


def _range(metrics: dict[str, Any], key: str) -> str:
    """The runs' lowest and highest; ``1 run`` where there was one (a configuration
    verification measured only in its first round, or not at all past its trial)."""
    value = metrics.get(key)
    if not isinstance(value, dict):
        return ""
    if len(value.get("values") or ()) == 1:
        return "1 run"
    return f"{value['min']:.0f}-{value['max']:.0f}"


def limit_line(limit: dict[str, Any] | None, what_if: bool = False) -> str | None:
    """Where the limit is, from best_config.json's ``limit`` section; ``what_if``: the
    file has estimates for bigger nodes to point at."""
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
    if limit["bound"] == "shared":
        return (
            f"input-bound beside the step: training took {trained:.0f} samples/s and waited "
            f"for data {limit['data_wait_frac']:.0%} of the time, where the input pipeline "
            f"alone delivers {alone:.0f}: beside the step its workers do less (on a CPU "
            f"they share its cores; {core})"
        )
    if limit["bound"] == "contended":
        if limit.get("device", "cpu") == "cpu":
            bigger = "report.md's What if estimates bigger nodes; " if what_if else ""
            where = f"on a CPU they share its cores ({bigger}"
        else:
            where = (
                "the training process's own work beside the step or the host's cores slow "
                "it (collation, transfers; "
            )
        return (
            f"contended: training took {trained:.0f} samples/s, waiting for data "
            f"{limit.get('data_wait_frac') or 0:.0%} of the time, "
            f"{limit['ceiling_share']:.0%} of the model's {limit['ceiling_samples_per_s']:.0f} "
            f"on a resident batch, where the input pipeline alone delivers {alone:.0f}: each "
            f"alone is faster than the two together; {where}{core})"
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
    if pipeline.get("fetch_threads", 1) > 1:
        where += f", {pipeline['fetch_threads']} requests in flight per worker"
    if pipeline.get("cache"):
        where += ", the bucket's objects kept on the node's disk after the first epoch"
    return f"{_DECODES.get(decode, decode)}, {transfer}, {where}"


def freeze_at_exit() -> None:
    """Spare this process's exit the garbage collector's passes over every object it
    holds. The interpreter's shutdown collects the whole heap several times over, which
    takes seconds for a process holding torch and Ray (experiments/cli_exit.py measures
    it). Exit handlers, buffered streams and the finalizers
    of objects freed by reference counting still run.

    Each command line's ``main`` calls it, so that the console script, ``python -m``
    and a caller's own process all exit sooner, and so does each experiment the GPU
    check runs; registered once, however often ``main`` runs."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


class TerminalProgress(Progress):
    """Progress lines; counters redraw in place on a terminal, print plainly otherwise."""

    def __init__(self, total_trials: int, objective: str, stream: TextIO = sys.stdout) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.total = total_trials
        self.objective = objective
        self.started = time.monotonic()
        self.done: dict[str, str] = {}
        self.running: set[str] = set()
        self.best: tuple[float, str] | None = None
        self._last_count: tuple[str, int] | None = None
        self._beat_ceiling = False  # said once: a trial beat the ceiling measured first

    def _line(self, text: str) -> None:
        self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
        self.stream.flush()

    def stage(self, text: str) -> None:
        self._line(f"==> {text}")

    def warn(self, text: str) -> None:
        self._line(f"warning: {text}")

    def count(self, what: str, done: int, total: int) -> None:
        if self.tty:
            end = "\n" if done == total else ""
            self.stream.write(f"\r\033[K    {what}: {done}/{total}{end}")
            self.stream.flush()
        elif (what, done * 4 // max(total, 1)) != self._last_count or done == total:
            self._last_count = (what, done * 4 // max(total, 1))
            self._line(f"    {what}: {done}/{total}")

    def trial(self, event: Any) -> None:
        if event.kind == "result" and not event.metrics.get("final"):
            self.running.add(event.trial_id)
            return
        if event.kind == "result":
            return  # the final result is followed by "complete"
        self.running.discard(event.trial_id)
        metrics = event.metrics
        label = _label(event.config)
        # a completed trial is done, whether it ran to its end or ASHA stopped it
        status = trial_status({**metrics, "done": True}, errored=event.kind == "error")
        word = WORDS.get(status, f"failed ({metrics.get('failure')})")
        self.done[event.trial_id] = word
        value = metrics.get(self.objective)
        if status == "ok" and value is not None and (self.best is None or value > self.best[0]):
            self.best = (float(value), label)
        self._line(self._trial_line(word, label, metrics))
        if _above_first_ceiling(metrics) and not self._beat_ceiling:
            self._beat_ceiling = True
            self._line(
                f"    (util above 1: the ceiling measured before the search, "
                f"{metrics['ceiling_samples_per_s']:.0f} samples/s, came out low, as this "
                "machine's speed varies; verification measures it again, and the results "
                "use the highest)"
            )

    def _trial_line(self, status: str, label: str, metrics: dict[str, Any]) -> str:
        n = len(self.done)
        elapsed = time.monotonic() - self.started
        eta = elapsed / n * (self.total - n) if n else 0.0
        figures = ""
        if status in ("done", "stopped early") and "samples_per_s" in metrics:
            figures = (
                f" {metrics['samples_per_s']:.0f} samples/s util {metrics.get('util', 0):.2f}"
                f" wait {metrics.get('data_wait_frac', 0):.2f}"
            )
        best = f" | best {self.best[0]:.3g} ({self.best[1]})" if self.best else ""
        counts = {s: list(self.done.values()).count(s) for s in ("done", "stopped early")}
        failed = n - counts["done"] - counts["stopped early"]
        return (
            f"[{n}/{self.total}] {status}: {label}{figures}{best} | done {counts['done']}, "
            f"stopped early {counts['stopped early']}, failed {failed} | "
            f"{elapsed:.0f}s elapsed, ~{eta:.0f}s left"
        )


def _above_first_ceiling(metrics: dict[str, Any]) -> bool:
    """A CPU trial's util is its rate over the ceiling measured before the search: above 1
    where that ceiling came out low (on a shared VM one process's ceiling spread 1.226x
    over a minute: results/benchmarks/ceiling_noise.json)."""
    util, ceiling = metrics.get("util"), metrics.get("ceiling_samples_per_s")
    return bool(ceiling) and metrics.get("util_source") == "step-timing" and (util or 0) > 1


def _label(config: dict[str, Any]) -> str:
    try:
        return LoaderConfig.from_trial_config(config).label()
    except RaytuneLoaderError:
        return str(config)


HEADER = ("config", "workers", "prefetch", "pin", "persist", "batch", "samples/s", "range",
          "util", "wait", "eff", "1st s", "tuned x")  # fmt: skip
WIDTHS = (16, 8, 9, 5, 8, 6, 11, 12, 6, 6, 6, 7, 8)


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _join(cells: Sequence[str]) -> str:
    first, *rest = (
        cell.ljust(width) if i == 0 else cell.rjust(width)
        for i, (cell, width) in enumerate(zip(cells, WIDTHS, strict=True))
    )
    return first + "".join(rest)


def summary_table(best: dict[str, Any]) -> list[str]:
    """Tuned and both baselines side by side; ``tuned x`` is the tuned speed over that
    row's. ``best`` is ``best_config.json`` or the bench's figures, in the same shape."""
    sections = {"tuned": best, **best["baselines"]}
    lines = [_join(HEADER)]
    for row in summary_rows(best):
        efficiency = sections[row["config"]]["metrics"].get("efficiency")
        cells = [
            row["config"], str(row["num_workers"]), str(row["prefetch_factor"] or "-"),
            "y" if row["pin_memory"] else "n", "y" if row["persistent_workers"] else "n",
            str(row["batch_size"]), _number(row["samples_per_s"], ".0f"),
            row["samples_per_s_range"] or "-", _number(row["util"], ".2f"),
            _number(row["data_wait_frac"], ".2f"),
            _number(efficiency["median"] if efficiency else None, ".2f"),
            _number(row["first_batch_s"], ".2f"), _number(row["tuned_speedup"], ".2f"),
        ]  # fmt: skip
        lines.append(_join(cells))
    return lines


def ceiling_line(metrics: dict[str, Any]) -> str | None:
    """How close the tuned loader comes to a perfect one, or why that is unknown."""
    if metrics.get("ceiling_note"):
        return f"Note: {metrics['ceiling_note']}."
    efficiency = (metrics.get("efficiency") or {}).get("median")
    ceiling = metrics.get("ceiling_samples_per_s")
    if efficiency and ceiling:
        return (
            f"The tuned loader reaches {efficiency:.0%} of a perfect loader's speed "
            f"(the model on a batch already on the device: {ceiling:.0f} samples/s)."
        )
    return None


def print_summary(best: dict[str, Any], out_dir: Any, stream: TextIO = sys.stdout) -> None:
    """The summary a search ends with: the table, the pipeline, Ray Data, the limit, the
    findings, how to use the result."""
    print("", file=stream)
    print("\n".join(summary_table(best)), file=stream)
    pipeline = best.get("pipeline")
    if pipeline:
        print(f"\ntuned pipeline: {pipeline_line(pipeline)}", file=stream)
    for engine in ENGINES.values():  # each engine's own section, where the file has one
        for line in engine.summary_lines(best):
            print(line, file=stream)
    line = ceiling_line(best["metrics"])
    if line:
        print(f"\n{line}", file=stream)
    limit = limit_line(best.get("limit"), bool(best.get("what_if")))
    if limit:
        print(limit, file=stream)
    for line in steady_lines(best):
        print(line, file=stream)
    for line in findings_lines(best):
        print(line, file=stream)
    selection = best.get("selection", {})
    if selection.get("decided_by_cost"):
        print(
            f"(chosen as the cheapest within noise of {selection['best_by_objective']})",
            file=stream,
        )
    print(f"\nbest config: {out_dir}/best_config.json   report: {out_dir}/report.md", file=stream)
    use = engine_named(best.get("engine", DataLoaderEngine.name)).use
    print(f"use it: tuned = load_best_config('{out_dir}/best_config.json'); {use}", file=stream)


# the hypervisor gave other guests this share of the machine's CPU time during the
# search or more: said, as its figures vary with it (on a 2-core VM the ceiling fell 18%
# as the steal rose from 1.4% to 4.7%: results/benchmarks/ceiling_noise.json)
NOISY_STEAL = 0.02


def noisy_line(best: dict[str, Any]) -> str | None:
    """That the machine was noisy, where its hypervisor took :data:`NOISY_STEAL` or more
    of its CPU time during the search."""
    steal = (best.get("hardware") or {}).get("cpu_steal_frac")
    if steal is None or steal < NOISY_STEAL:
        return None
    return (
        f"noisy machine: its hypervisor gave {steal:.0%} of this machine's CPU time to "
        "other guests during the search (CPU steal), so runs of one configuration "
        "differ (range above) and close calls are noise; a quieter or dedicated "
        "machine measures steadier"
    )


def steady_lines(best: dict[str, Any]) -> list[str]:
    """What the user must know of the verified figures: runs left out for beating their
    bound, a winner whose windows were not steady, a machine whose CPUs were shared."""
    out = []
    metrics = best["metrics"]
    noisy = noisy_line(best)
    if noisy:
        out.append(noisy)
    if metrics.get("steady") is False:
        out.append(
            "not steady: most of the tuned configuration's runs measured halves more than "
            "20% apart (no steady configuration was found; docs/measurement.md)"
        )
    out += [f"left out of {name}'s figures: a run {reason}" for name, reason in refused(best)]
    return out


def refused(best: dict[str, Any]) -> list[tuple[str, str]]:
    """(configuration, why) of each verification run left out for beating its bound."""
    sections = {"tuned": best, **best.get("baselines", {})}
    return [(name, reason) for name, section in sections.items()
            for reason in section["metrics"].get("refused", [])]  # fmt: skip


def notes(trials: Sequence[TrialRecord]) -> list[str]:
    """What the user should know about trials that were refused or failed."""
    out = []
    refused = [r for r in trials if r.reason.startswith("shm")]
    if refused:
        out.append(
            f"{len(refused)} configuration(s) did not fit in /dev/shm, which limited the search; "
            "raise it (docker run --shm-size=8g, or a larger tmpfs) and search again"
        )
    failed = [r for r in trials if r.status in ("failed", "error")]
    if failed:
        out.append(f"{len(failed)} trial(s) failed; reasons are in trials.csv")
    unsteady = [r for r in trials if r.steady is False]
    if unsteady:
        out.append(
            f"{len(unsteady)} trial(s) measured a window whose halves differed by more than "
            "20% (not steady, ranked after the steady ones; trials.csv: steady_ratio); "
            "longer windows (--steps) settle them"
        )
    beyond = [r for r in trials if r.bounds]
    if beyond:
        out.append(
            f"{len(beyond)} trial(s) measured above the ceiling beyond noise, a measurement "
            f"defect (not verified): {beyond[0].bounds}"
        )
    return out


def exit_status(exc: RaytuneLoaderError | KeyboardInterrupt, interrupted: str) -> int:
    """Say why a command line stops, in one line on stderr, and return its exit status:
    130 interrupted (``interrupted`` says what is kept), 2 a mistake in the input, 1 a
    failure of the run."""
    if isinstance(exc, SearchInterruptedError):
        print(f"interrupted: {exc}", file=sys.stderr)
        return 130
    if isinstance(exc, KeyboardInterrupt):
        print(interrupted, file=sys.stderr)
        return 130
    print(f"error: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, UserInputError) else 1


def findings_lines(best: dict[str, Any]) -> list[str]:
    """What the command line prints of the findings (``best_config.json``'s): one line a
    finding, the figure then the fix, or one line saying there were none; and the
    tuned loader's epoch start."""
    if "findings" not in best:  # written before findings existed
        return []
    found = [f"finding ({f['kind']}): {f['figure']}. fix: {f['fix']}" for f in best["findings"]]
    if not found:
        found = ["no findings: memory growth, worker threads, stragglers and epoch starts "
                 "were watched (report.md, Findings)"]  # fmt: skip
    start = epoch_start_line((best.get("watch") or {}).get("epoch_start_s") or {})
    return found + ([start] if start else [])


def epoch_start_line(starts: dict[str, float | None]) -> str | None:
    """``epoch start: 0.05 s with persistent workers, 0.42 s without``."""
    kept, fresh = starts.get("persistent"), starts.get("fresh")
    if kept is not None and fresh is not None:
        return f"epoch start: {kept:.2f} s with persistent workers, {fresh:.2f} s without"
    if kept is not None:
        return f"epoch start: {kept:.2f} s with persistent workers"
    return None if fresh is None else f"epoch start: {fresh:.2f} s"
