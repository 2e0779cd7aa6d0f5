"""Shared set-up of the experiments: the embedded dataset and a trial job for it."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from torch.utils.data import Subset

from raytune_loader import SearchOptions, datasets, hardware, synthetic
from raytune_loader.job import TrialJob, job_from_options, prepare_data, subset_indices
from raytune_loader.measure import worker_side_rate
from raytune_loader.models import default_model
from raytune_loader.results import write_json

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
    return worker_side_rate(Subset(full, subset_indices(len(full), samples, job.seed)), samples)


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
