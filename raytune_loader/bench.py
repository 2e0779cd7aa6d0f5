"""The bench: ``python -m raytune_loader.bench --config results/<dataset>/best_config.json``.

Re-measures the tuned configuration and both baselines (``pytorch-default`` and
``heuristic``, as recorded in the file) on this machine, side by side: the job is
rebuilt from the file's ``search`` section (dataset, model, segment, subset,
seed, device) through the search's own options, the subset is pre-warmed once,
the model's ceiling is measured first and again in every round, and each
configuration is trained in this process, one at a time with the whole machine,
``--repeats`` times in a rotated order so that drift hits all alike. No Ray is
needed. The table gives each configuration's median samples/s with its range,
utilisation, data wait, efficiency and the tuned one's speedup over it;
``--json`` also writes the figures. A mistake in the input is one line on
stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import (
    ConfigError,
    OutputError,
    RaytuneLoaderError,
    SearchFailedError,
)
from raytune_loader.files import write_json
from raytune_loader.machine import hardware
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.measurer import LocalMeasurer, measure_ceilings
from raytune_loader.measuring.outcomes import TrialOutcome
from raytune_loader.measuring.prepare import prepare_data
from raytune_loader.outputs.bestconfig import metrics_of
from raytune_loader.outputs.console import (
    ceiling_line,
    exit_status,
    freeze_at_exit,
    summary_rows,
    summary_table,
)
from raytune_loader.outputs.reader import (
    BestConfig,
    HardwareMismatchWarning,
    load_best_config,
    recorded_baselines,
    recorded_options,
)
from raytune_loader.progress import LogProgress
from raytune_loader.search import OneLineErrorParser
from raytune_loader.tuning.options import check_data_root, job_from_options
from raytune_loader.tuning.space import HEURISTIC, PYTORCH_DEFAULT
from raytune_loader.verdict.selection import Candidate
from raytune_loader.verdict.verify import verify

log = logging.getLogger(__name__)
TUNED = "tuned"


@dataclass(frozen=True)
class BenchPlan:
    """What to measure: the rebuilt job and the three configurations, by name."""

    job: TrialJob
    configs: dict[str, LoaderConfig]
    notes: tuple[str, ...] = ()


def _device(requested: str) -> tuple[str, str | None]:
    """The device to measure on, and a note when it is not the one the file was tuned on."""
    if requested != "cpu" and requested.partition(":")[0] != "cuda":
        raise ConfigError(f"search.device must be cpu or cuda, not {requested!r}")
    if requested != "cpu" and not hardware.cuda_available():
        return "cpu", "tuned on CUDA, but this machine has no usable GPU: measuring on the CPU"
    return requested, None


def plan_from_config(
    best: BestConfig, steps: int | None = None, data_root: str | None = None
) -> BenchPlan:
    """What to measure, from a validated ``best_config.json``, on this machine."""
    check_data_root(data_root)
    opts = recorded_options(best.data, str(best.path), steps, data_root)
    assert opts.train_step or opts.model
    device, note = _device(str(best.data["search"]["device"]))
    configs = {TUNED: best.loader, **recorded_baselines(best.data, str(best.path))}
    largest = max(config.batch_size for config in configs.values())
    if opts.samples_per_trial < largest:
        raise ConfigError(
            f"{best.path}: search.samples_per_trial ({opts.samples_per_trial}) is smaller than "
            f"a batch ({largest})"
        )
    job = job_from_options(opts, opts.model or "", device=device, node_cpus=hardware.usable_cpus())
    if not isinstance(best.data.get("job"), dict):
        job = replace(job, precision=None)  # an older file: PyTorch's own settings
    return BenchPlan(job, configs, (note,) if note else ())


def figures(candidates: Sequence[Candidate]) -> dict[str, Any]:
    """The measurements in best_config.json's shape: tuned, then the baselines."""
    # the objective only says what the search maximised; every metric is reported anyway
    by_name = {c.name: {"loader": c.config.kwargs(), "metrics": metrics_of(c)}
               for c in candidates}  # fmt: skip
    tuned = by_name.pop(TUNED)
    return {**tuned, "baselines": by_name}


def progress_line(done: int, total: int, name: str, repeat: int, outcome: TrialOutcome) -> str:
    """One bench run as a line: the candidate, then its figures or why it failed."""
    head = f"[{done}/{total}] {name} run {repeat}: {outcome.config.label()}"
    if outcome.metrics is None:
        return f"{head}: failed ({outcome.failure}) {outcome.detail or ''}".rstrip()
    m = outcome.metrics
    return f"{head}: {m.samples_per_s:.0f} samples/s util {m.util:.2f} wait {m.data_wait_frac:.2f}"


def failure_notes(candidates: Sequence[Candidate]) -> list[str]:
    """A line for each candidate some of whose runs failed, with the reasons."""
    notes = []
    for candidate in candidates:
        failed = [o for o in candidate.outcomes if o.failure]
        if failed:
            reasons = sorted({f"{o.failure}: {o.detail}" for o in failed})
            notes.append(
                f"{candidate.name} failed {len(failed)} of {len(candidate.outcomes)} runs "
                f"({'; '.join(reasons)[:300]})"
            )
    return notes


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def get_args_parser() -> argparse.ArgumentParser:
    """The bench's command line (``python -m raytune_loader.bench --help``)."""
    p = OneLineErrorParser(
        prog="python -m raytune_loader.bench",
        description="Re-measure a tuned DataLoader configuration and both baselines on this "
        "machine, side by side.",
    )
    p.add_argument("--config", required=True, help="a best_config.json written by the search")
    p.add_argument("--repeats", type=_positive, default=3, help="runs of each configuration")
    p.add_argument("--steps", type=_positive, help="measured steps per run (the search's)")
    p.add_argument("--data-root", help="where the data is on this machine (the search's)")
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    p.add_argument(
        "--tuned-only", action="store_true",
        help="measure the tuned configuration alone, not the baselines beside it",
    )  # fmt: skip
    p.add_argument("--verbose", action="store_true", help="log what happens")
    return p


def _other_machine(best: BestConfig) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HardwareMismatchWarning)  # said once, as a note
        return best.warn_if_other_machine()


def _speedups(measured: dict[str, Any]) -> dict[str, float | None]:
    by_name = {row["config"]: row["tuned_speedup"] for row in summary_rows(measured)}
    return {
        "vs_pytorch_default": by_name.get(PYTORCH_DEFAULT),
        "vs_heuristic": by_name.get(HEURISTIC),
    }


def _write_figures(path: Path, measured: dict[str, Any]) -> None:
    try:
        write_json(path, {**measured, "speedup": _speedups(measured)})
    except OSError as exc:
        raise OutputError(
            f"cannot write {path} ({exc.strerror or exc}); choose another --json"
        ) from None


class _Said(LogProgress):
    """The data's preparation as the bench's lines (its stages: the subset pre-warmed)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say

    def stage(self, text: str) -> None:
        self.say(f"    {text}")

    def warn(self, text: str) -> None:
        self.say(f"warning: {text}")


def run_bench(args: argparse.Namespace, say: Callable[[str], None]) -> list[Candidate]:
    """The whole bench; ``say`` shows a line of progress."""
    best = load_best_config(args.config)
    plan = plan_from_config(best, args.steps, args.data_root)
    for note in [*plan.notes, *(f"tuned on another machine: {d}" for d in _other_machine(best))]:
        say(f"note: {note}")
    job = plan.job
    configs = {TUNED: plan.configs[TUNED]} if args.tuned_only else plan.configs
    batch_sizes = sorted({config.batch_size for config in configs.values()})
    say(f"==> Preparing {job.dataset.name}")
    job = prepare_data(job, max(batch_sizes), _Said(say))  # what it reads, and its files
    say(f"==> Ceiling: {job.model} on a resident batch, {job.device}")
    measurer = LocalMeasurer()
    ceilings = measure_ceilings(job, batch_sizes, measurer, LogProgress(), required=False)
    say(
        f"==> Measuring {len(configs)} configurations x {args.repeats} "
        f"({job.segment.warmup_steps} warm-up + {job.segment.steps} measured steps each, "
        "the ceiling again in every round)"
    )
    verified = verify(
        replace(job, ceilings=ceilings), configs, args.repeats, measurer,
        on_measured=lambda *event: say(progress_line(*event)),
    )  # fmt: skip
    return verified.candidates


def main(argv: list[str] | None = None) -> int:
    """``python -m raytune_loader.bench``: re-measure a ``best_config.json`` here; the exit
    status."""
    freeze_at_exit()
    args = get_args_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        candidates = run_bench(args, lambda line: print(line, flush=True))
        if not any(c.ok for c in candidates):
            raise SearchFailedError("every run failed: " + "; ".join(failure_notes(candidates)))
        measured = figures(candidates)
        print("\n" + "\n".join(summary_table(measured)))
        line = ceiling_line(measured["metrics"])
        if line:
            print(line)
        for note in failure_notes(candidates):
            print(f"note: {note}")
        if args.json is not None:
            _write_figures(args.json, measured)
    except (RaytuneLoaderError, KeyboardInterrupt) as exc:
        return exit_status(exc, "interrupted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
