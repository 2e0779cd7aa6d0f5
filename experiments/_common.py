"""Shared set-up of the experiments: the embedded dataset and a trial job for it."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from raytune_loader import hardware, synthetic
from raytune_loader.datasets import SYNTHETIC, DatasetSpec
from raytune_loader.measure import SegmentSpec, TrialJob
from raytune_loader.models import default_model
from raytune_loader.results import write_json

RESULTS = Path(
    os.environ.get("BENCH_DIR", Path(__file__).resolve().parent.parent / "results" / "benchmarks")
)


def default_job(steps: int = 60, largest_batch: int = 0) -> TrialJob:
    """The job the default search runs: synthetic-imagenet, the per-device model.

    Its subset holds 1024 samples, or one batch of ``largest_batch`` if that is more.
    """
    samples_per_trial = max(1024, largest_batch)
    cuda = hardware.cuda_available()
    spec = DatasetSpec(SYNTHETIC)
    root = spec.resolved_root()
    assert root is not None
    synthetic.ensure_synthetic_imagenet(
        root,
        spec.synthetic_images,
        processes=hardware.usable_cpus(),
        progress=lambda done, total: print(f"generating {done}/{total}", flush=True),
    )
    return TrialJob(
        dataset=spec,
        model=default_model(cuda),
        segment=SegmentSpec(warmup_steps=5, steps=steps, report_every=steps),
        device="cuda" if cuda else "cpu",
        samples_per_trial=samples_per_trial,
        node_cpus=hardware.usable_cpus(),
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
