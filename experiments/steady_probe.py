"""The steady window against a dataset whose true rate is known, before and after.

Each sample takes ``--delay-ms`` to make, asleep, so the input delivers exactly
(workers or 1) x 1000 / delay samples/s whatever the cores; the training step's first
call takes ``--first-step-s`` (as cuDNN's autotuning, allocation or torch.compile do
on a GPU) and every later one nothing. Every loader configuration of the default
space on this machine is measured (each (workers, prefetch, worker kind, order); the
settings that do not change how much the loader holds are left at their defaults),
and the deepest queues the issue named (4 and 8 thread workers and 2 process workers
at prefetch 16): by ``train_segment`` (the steady window) and by the short window
the search used before (5 warm-up steps, then the loop's own rate over the measured
steps, nothing drained), rotated, each in this process.

    python experiments/steady_probe.py [--delay-ms 10] [--first-step-s 2] [--batch 16]

Writes results/benchmarks/steady_probe.json: measured / true for each configuration
both ways (target: 0.9-1.1 for the steady window, every configuration).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from _common import save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.candidates.rules import PREFETCH_FACTORS
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.machine import hardware
from raytune_loader.measuring.job import SegmentSpec
from raytune_loader.measuring.segment import train_segment
from raytune_loader.measuring.step import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from datasets_for_tests import Paced, SlowFirstStep  # noqa: E402

DEEP = [(4, 8, "thread"), (8, 8, "thread"), (2, 16, "process")]  # the table
BATCH = 16


def configurations(max_workers: int) -> list[LoaderConfig]:
    """Each loader shape of the default space up to ``max_workers``, then the deep rows."""
    shapes = [(0, None, "process", True)]
    for workers in range(1, max_workers + 1):
        for prefetch in PREFETCH_FACTORS:
            for kind in ("process", "thread"):
                shapes += [(workers, prefetch, kind, order) for order in (True, False)]
    shapes += [(w, p, kind, True) for w, p, kind in DEEP]
    return [
        LoaderConfig.from_dict(
            {"num_workers": w, "prefetch_factor": p, "workers": kind, "in_order": order}, BATCH
        )
        for w, p, kind, order in shapes
    ]


def short_window(dataset: Any, config: LoaderConfig, spec: SegmentSpec, first_s: float) -> float:
    """The window as measured before: ``warmup_steps`` steps, then the loop's own rate
    over ``steps`` steps, whatever the loader held when it started."""
    step = SlowFirstStep(first_s)
    torch.set_num_threads(1)
    samples = BATCH * (spec.warmup_steps + spec.steps + 1)
    loader = build_dataloader(dataset, config, samples_per_epoch=samples)
    batches = iter(loader)
    try:
        for _ in range(spec.warmup_steps):
            step(next(batches))
        start = time.perf_counter()
        for _ in range(spec.steps):
            step(next(batches))
        return BATCH * spec.steps / (time.perf_counter() - start)
    finally:
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        elif hasattr(batches, "close"):
            batches.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=10.0)
    parser.add_argument("--first-step-s", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--warmup-steps", type=int, default=5)
    args = parser.parse_args()
    per_worker = 1000.0 / args.delay_ms
    spec = SegmentSpec(args.warmup_steps, args.steps, args.steps)
    dataset = Paced(4096, delay_s=args.delay_ms / 1000)
    max_workers = hardware.usable_cpus()  # the default --max-workers
    rows = []
    for config in configurations(max_workers):
        true = max(1, config.num_workers) * per_worker
        row: dict[str, Any] = {"config": config.label(), "true_samples_per_s": true}
        # rotated: half the configurations measure the old window first
        ways = ["steady", "short"] if len(rows) % 2 == 0 else ["short", "steady"]
        for way in ways:
            if way == "steady":
                trainer = Trainer(SlowFirstStep(args.first_step_s), torch.device("cpu"))
                metrics = train_segment(dataset, trainer, config, spec)
                row["steady"] = metrics.samples_per_s / true
                row["steady_window"] = metrics.steady
            else:
                row["short"] = short_window(dataset, config, spec, args.first_step_s) / true
        rows.append(row)
        print(f"{row['config']:<60} true {true:6.0f}  short {row['short']:7.2f}x  "
              f"steady {row['steady']:5.2f}x", flush=True)  # fmt: skip
    steady = [r["steady"] for r in rows]
    short = [r["short"] for r in rows]
    save(
        "steady_probe",
        {
            "delay_ms": args.delay_ms,
            "first_step_s": args.first_step_s,
            "batch_size": BATCH,
            "warmup_steps": args.warmup_steps,
            "steps": args.steps,
            "max_workers": max_workers,
            "configurations": len(rows),
            "steady_measured_over_true": {"min": min(steady), "max": max(steady),
                                          "median": statistics.median(steady)},
            "short_measured_over_true": {"min": min(short), "max": max(short),
                                         "median": statistics.median(short)},
            "target": "steady measured / true within 0.9-1.1 for every configuration",
            "met": all(0.9 <= s <= 1.1 for s in steady),
            "rows": rows,
        },
    )  # fmt: skip


if __name__ == "__main__":
    main()
