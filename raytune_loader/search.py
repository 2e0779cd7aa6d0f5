"""Command line: ``python -m raytune_loader.search --dataset NAME [options]``.

Parses the options (contract in DESIGN.md), shows progress, prints the summary
table and exits 0, or prints one line saying what went wrong and exits 2 for a
user mistake, 1 when the search itself failed. The only module that prints.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any, NoReturn, TextIO

from raytune_loader import __version__
from raytune_loader.api import OBJECTIVES, SearchOptions, run_search
from raytune_loader.datasets import KNOWN, SYNTHETIC
from raytune_loader.errors import RaytuneLoaderError, SearchInterruptedError, UserInputError
from raytune_loader.report import summary_rows
from raytune_loader.space import LoaderConfig

_FLOAT_OPTIONS = ("time_budget", "gpus_per_trial", "cpus_per_worker")


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"batch sizes must be positive integers, got {text!r}"
        ) from None
    if not sizes or any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return sizes


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a bad option is one line on stderr and exit status 2 (all our CLIs)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def get_args_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog="python -m raytune_loader.search",
        description="Find the DataLoader settings that keep your accelerator busy "
        "(a Ray Tune search guided by Optuna).",
    )
    p.add_argument(
        "--dataset",
        default=SYNTHETIC,
        help=f"one of {', '.join(KNOWN)}, or package.module:function (default {SYNTHETIC})",
    )
    p.add_argument("--data-root", help="where the data is")
    p.add_argument("--download", action="store_true", help="let torchvision download cifar/mnist")
    p.add_argument(
        "--synthetic-images",
        type=int,
        default=2000,
        help="images in the generated default dataset (default 2000)",
    )
    p.add_argument(
        "--model",
        help="torchvision model name, small-cnn or package.module:function "
        "(default resnet50 on a GPU, small-cnn on a CPU)",
    )
    p.add_argument("--num-samples", type=int, default=12, help="number of trials (default 12)")
    p.add_argument("--time-budget", type=float, help="stop starting new trials after SECONDS")
    p.add_argument(
        "--max-concurrent",
        type=int,
        help="trials at once (default: 1 on a CPU, GPUs / gpus-per-trial on a GPU)",
    )
    p.add_argument(
        "--gpus-per-trial", type=float, help="fractional GPU per trial (default 0.5 with CUDA)"
    )
    p.add_argument(
        "--cpus-per-worker",
        type=float,
        default=1.0,
        help="CPUs reserved per loader worker (default 1; e.g. 0.5 for I/O-bound data)",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--batch-size", type=_batch_sizes, dest="batch_sizes", help="fixed batch size"
    )
    group.add_argument(
        "--batch-sizes",
        type=_batch_sizes,
        dest="batch_sizes",
        help="comma-separated batch sizes to search (the first is the baselines')",
    )
    p.add_argument(
        "--min-batch-size", type=int, default=1, help="smallest batch size for OOM back-off"
    )
    p.add_argument("--max-workers", type=int, help="cap on num_workers (default: usable CPUs)")
    p.add_argument(
        "--objective",
        choices=("util", "throughput"),
        default="util",
        help="what to maximize (default util)",
    )
    p.add_argument("--steps", type=int, default=60, help="measured training steps per trial")
    p.add_argument("--warmup-steps", type=int, default=5, help="unmeasured steps first")
    p.add_argument(
        "--report-every", type=int, default=20, help="steps between reports to Tune/ASHA"
    )
    p.add_argument("--samples-per-trial", type=int, default=1024, help="size of the fixed subset")
    p.add_argument(
        "--compute-threads",
        type=int,
        default=1,
        help="torch threads of the training step, the same in every trial (default 1)",
    )
    p.add_argument(
        "--trial-timeout",
        type=float,
        default=600.0,
        help="seconds after which a trial ends with reason timeout (default 600)",
    )
    p.add_argument("--verify-top", type=int, default=3, help="top configurations re-measured")
    p.add_argument("--verify-repeats", type=int, default=3, help="repeats of each re-measurement")
    p.add_argument("--out", default="results", help="results root (default results/)")
    p.add_argument("--address", help="join an existing Ray cluster (auto, ray://host:port)")
    p.add_argument(
        "--node-type",
        help="on a cluster, only use nodes carrying this Ray custom resource (ray start "
        "--resources '{\"LABEL\": 1}'), to tune for one node type at a time",
    )
    p.add_argument(
        "--storage",
        help="where Tune keeps the experiment: a path every node shares, or a bucket "
        "(s3://, gs://); default results/<dataset>/tune",
    )
    p.add_argument(
        "--dashboard-host",
        default="127.0.0.1",
        help="address the local Ray dashboard listens on (default 127.0.0.1, this machine only)",
    )
    p.add_argument(
        "--expose-dashboard",
        action="store_true",
        help="confirm a non-loopback --dashboard-host (anyone who reaches it and has the "
        "token can run code on this machine)",
    )
    p.add_argument("--resume", action="store_true", help="continue the interrupted search")
    p.add_argument(
        "--cold",
        action="store_true",
        help="for datasets larger than RAM: each trial reads samples no earlier trial read, "
        "instead of one pre-warmed subset",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the search and the data subset")
    p.add_argument("--verbose", action="store_true", help="show Tune's own table and Ray's logs")
    p.add_argument("--version", action="version", version=f"raytune_loader {__version__}")
    return p


def options_from_args(args: argparse.Namespace) -> SearchOptions:
    objective = "samples_per_s" if args.objective == "throughput" else args.objective
    assert objective in OBJECTIVES
    return SearchOptions(
        dataset=args.dataset, data_root=args.data_root, download=args.download,
        synthetic_images=args.synthetic_images, model=args.model, num_samples=args.num_samples,
        time_budget_s=args.time_budget, max_concurrent=args.max_concurrent,
        gpus_per_trial=args.gpus_per_trial, cpus_per_worker=args.cpus_per_worker,
        batch_sizes=args.batch_sizes or (32,), min_batch_size=args.min_batch_size,
        max_workers=args.max_workers, objective=objective, steps=args.steps,
        warmup_steps=args.warmup_steps, report_every=args.report_every,
        samples_per_trial=args.samples_per_trial, compute_threads=args.compute_threads,
        trial_timeout_s=args.trial_timeout,
        verify_top=args.verify_top, verify_repeats=args.verify_repeats, out=args.out,
        address=args.address, node_type=args.node_type, storage=args.storage,
        dashboard_host=args.dashboard_host,
        expose_dashboard=args.expose_dashboard, resume=args.resume, seed=args.seed, cold=args.cold,
        verbose=args.verbose,
    )  # fmt: skip


class TerminalProgress:
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
        if event.kind == "error":
            status = "error"
        elif metrics.get("failure"):
            status = f"failed ({metrics['failure']})"
        elif metrics.get("final"):
            status = "done"
        else:
            status = "stopped early"
        self.done[event.trial_id] = status
        value = metrics.get(self.objective)
        if status == "done" and value is not None and (self.best is None or value > self.best[0]):
            self.best = (float(value), label)
        self._line(self._trial_line(status, label, metrics))

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


def _label(config: dict[str, Any]) -> str:
    try:
        return LoaderConfig.from_trial_config(config).label()
    except RaytuneLoaderError:
        return str(config)


def print_summary(best: dict[str, Any], out_dir: Any, stream: TextIO = sys.stdout) -> None:
    rows = summary_rows(best)
    header = (
        f"{'config':<16}{'workers':>8}{'prefetch':>9}{'pin':>5}{'persist':>8}{'batch':>6}"
        f"{'samples/s':>11}{'range':>12}{'util':>6}{'wait':>6}{'tuned x':>8}"
    )
    print("", file=stream)
    print(header, file=stream)
    for r in rows:
        speedup = f"{r['tuned_speedup']:.2f}" if r["tuned_speedup"] else "-"
        print(
            f"{r['config']:<16}{r['num_workers']:>8}{str(r['prefetch_factor'] or '-'):>9}"
            f"{'y' if r['pin_memory'] else 'n':>5}{'y' if r['persistent_workers'] else 'n':>8}"
            f"{r['batch_size']:>6}{r['samples_per_s'] or 0:>11.0f}{r['samples_per_s_range']:>12}"
            f"{r['util'] or 0:>6.2f}{r['data_wait_frac'] or 0:>6.2f}{speedup:>8}",
            file=stream,
        )
    efficiency = (best["metrics"].get("efficiency") or {}).get("median")
    ceiling = best["metrics"].get("ceiling_samples_per_s")
    if efficiency and ceiling:
        print(
            f"\nThe tuned loader reaches {efficiency:.0%} of a perfect loader's speed "
            f"(the model on a batch already on the device: {ceiling:.0f} samples/s).",
            file=stream,
        )
    selection = best.get("selection", {})
    if selection.get("decided_by_cost"):
        print(
            f"(chosen as the cheapest within noise of {selection['best_by_objective']})",
            file=stream,
        )
    print(f"\nbest config: {out_dir}/best_config.json   report: {out_dir}/report.md", file=stream)
    print(
        f"use it: loader = load_best_config('{out_dir}/best_config.json').dataloader(dataset)",
        file=stream,
    )


def main(argv: list[str] | None = None) -> int:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        options = options_from_args(args)
        progress = TerminalProgress(options.num_samples, options.objective)
        result = run_search(options, progress)
    except SearchInterruptedError as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
        return 130
    except UserInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RaytuneLoaderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; finished trials are kept, continue with --resume", file=sys.stderr)
        return 130
    print_summary(result.best_config, result.out_dir)
    for note in notes(result.trials):
        print(f"note: {note}")
    return 0


def notes(rows: list[dict[str, Any]]) -> list[str]:
    """What the user should know about trials that were refused or failed."""
    out = []
    refused = [r for r in rows if str(r.get("reason", "")).startswith("shm")]
    if refused:
        out.append(
            f"{len(refused)} configuration(s) did not fit in /dev/shm, which limited the search; "
            "raise it (docker run --shm-size=8g, or a larger tmpfs) and search again"
        )
    failed = [r for r in rows if r.get("status") in ("failed", "error")]
    if failed:
        out.append(f"{len(failed)} trial(s) failed; reasons are in trials.csv")
    return out


if __name__ == "__main__":
    sys.exit(main())
