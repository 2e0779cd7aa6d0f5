"""Shared set-up of the experiments: the embedded dataset and a trial job for it."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import Subset

from raytune_loader import SearchOptions
from raytune_loader.files import write_json
from raytune_loader.machine import hardware
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.measure import worker_side_rate
from raytune_loader.measuring.models import default_model
from raytune_loader.measuring.prepare import prepare_data
from raytune_loader.sources import datasets, synthetic
from raytune_loader.tuning.options import job_from_options
from raytune_loader.verdict.selection import rotated

# a tiny search's flags, for the experiments that time whole searches
TINY_SEARCH = [
    "--dataset", "synthetic-imagenet", "--synthetic-images", "96", "--batch-size", "8",
    "--steps", "6", "--warmup-steps", "1", "--report-every", "3", "--samples-per-trial", "64",
    "--verify-top", "1", "--verify-repeats", "2", "--precision", "tf32", "--num-samples", "4",
]  # fmt: skip

RESULTS = Path(
    os.environ.get("BENCH_DIR", Path(__file__).resolve().parent.parent / "results" / "benchmarks")
)


def add_images_flag(parser: argparse.ArgumentParser) -> None:
    """--synthetic-images: the size of the generated dataset, so that every stage of a
    run reads the one dataset its search read (experiments/gpu_check.sh)."""
    parser.add_argument(
        "--synthetic-images", type=int, default=synthetic.DEFAULT_IMAGES,
        help=f"images in the generated dataset (default {synthetic.DEFAULT_IMAGES})",
    )  # fmt: skip


def default_job(
    steps: int = 60, largest_batch: int = 0, images: int = synthetic.DEFAULT_IMAGES
) -> TrialJob:
    """The job the default search runs: synthetic-imagenet of ``images`` files, the
    per-device model.

    Its subset holds 1024 samples, or one batch of ``largest_batch`` if that is more.
    """
    cuda = hardware.cuda_available()
    opts = SearchOptions(
        steps=steps, report_every=steps, samples_per_trial=max(1024, largest_batch),
        synthetic_images=images,
    )  # fmt: skip
    job = job_from_options(
        opts,
        default_model(cuda),
        device="cuda" if cuda else "cpu",
        node_cpus=hardware.usable_cpus(),
    )
    return prepare_data(job, max(32, largest_batch))


def decode_rate(
    job: TrialJob, samples: int = 256, transfer: str = "float32", decode: str = "pil"
) -> float:
    """Samples per second one core reads, decodes and augments (a worker's share of the
    pipeline variant ``transfer`` x ``decode``)."""
    full = datasets.build_dataset(job.dataset, transfer, decode)
    return worker_side_rate(
        Subset(full, datasets.subset_indices(len(full), samples, job.seed)), samples
    )


def save(name: str, figures: dict[str, Any]) -> Path:
    """Write results/benchmarks/<name>.json with the machine it was measured on."""
    figures["machine"] = {
        **hardware.cpu_and_gpu_summary(),
        "python": platform.python_version(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    path = RESULTS / f"{name}.json"
    write_json(path, figures)
    print(json.dumps({k: v for k, v in figures.items() if k != "machine"}, indent=1)[:2000])
    print(f"wrote {path}")
    return path


def timed_search(setup: str, args: list[str]) -> list[tuple[float, str]]:
    """The CLI search in a subprocess, after the Python statements ``setup`` (a
    constant of the package changed, say), and its output lines, each with the seconds
    since it started."""
    code = (
        f"import sys; {setup}; from raytune_loader.search import main; sys.exit(main(sys.argv[1:]))"
    )
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-u", "-c", code, *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    lines = [(time.perf_counter() - start, line.rstrip()) for line in process.stdout]
    if process.wait() != 0:
        raise SystemExit("\n".join(line for _, line in lines[-20:]))
    return lines


def search_rounds(
    variants: list[str], rounds: int, measure: Callable[[str, list[str]], dict[str, float]]
) -> tuple[dict[str, list[dict[str, float]]], dict[str, dict[str, float]]]:
    """``rounds`` rotated rounds of ``measure(variant, flags)`` for each variant, the tiny
    search's flags on a scratch folder: every run's figures, and their medians."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        flags = [*TINY_SEARCH, "--data-root", str(Path(tmp) / "data"),
                 "--out", str(Path(tmp) / "out")]  # fmt: skip
        for repeat, name in rotated(variants, rounds):
            found = measure(name, flags)
            runs[name].append(found)
            print(f"round {repeat + 1}: {name:<20} {found}", flush=True)
    medians = {name: {key: statistics.median(r[key] for r in found) for key in found[0]}
               for name, found in runs.items()}  # fmt: skip
    return runs, medians


def in_flight(config: Any) -> int:
    """Batches a candidate holds besides the one trained on: its engine's drain."""
    from raytune_loader.engines import engine_of

    return engine_of(config).in_flight()
