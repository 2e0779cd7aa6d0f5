"""worker_threads on a transform that runs multi-threaded BLAS: one thread against the
libraries' default, measured side by side in one run.

    python experiments/worker_threads.py [--repeats 5] [--steps 40]

The dataset (tests/datasets_for_tests.py's ``blas_transform``) runs two 256 x 256
matrix products in numpy for every sample, as transforms built on numpy, SciPy or
OpenCV do. Each configuration (one and two worker processes, each with the
libraries' own thread pools and with ``worker_threads=1``) trains the same segment,
in rotated rounds, in this process. Writes results/benchmarks/worker_threads.json:
samples/s of each (median and range), the speedup of one thread per worker, the busy
threads each worker ran, and the thread pools the workers inherit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from _common import save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.measure import run_trial
from raytune_loader.sources.datasets import DatasetSpec
from raytune_loader.verdict.selection import rotated

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the dataset


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="measured steps per run")
    args = parser.parse_args()
    job = TrialJob(
        dataset=DatasetSpec("datasets_for_tests:blas_transform"), model="small-cnn",
        segment=SegmentSpec(warmup_steps=5, steps=args.steps, report_every=args.steps),
        samples_per_trial=512,
    )  # fmt: skip
    configs = {}
    for workers in (1, 2):
        base = LoaderConfig(16, workers, 2, False, True)
        configs[f"{workers} workers, default threads"] = base
        configs[f"{workers} workers, worker_threads=1"] = replace(base, worker_threads=1)
    speeds: dict[str, list[float]] = {name: [] for name in configs}
    busy: dict[str, list[float]] = {name: [] for name in configs}
    pools = []
    for repeat, name in rotated(list(configs), args.repeats):
        outcome = run_trial(job, configs[name])
        assert outcome.metrics is not None, outcome.detail
        speeds[name].append(outcome.metrics.samples_per_s)
        busy[name].append(outcome.metrics.worker_busy_threads or 0.0)
        if outcome.metrics.watch and not pools:
            pools = [{"library": lib, "threads": n} for lib, n in outcome.metrics.watch.libraries]
        print(f"round {repeat + 1}: {name:<30} {speeds[name][-1]:7.0f} samples/s, "
              f"{busy[name][-1]:.1f} busy threads per worker", flush=True)  # fmt: skip
    speedup = {
        f"{workers} workers": statistics.median(speeds[f"{workers} workers, worker_threads=1"])
        / statistics.median(speeds[f"{workers} workers, default threads"])
        for workers in (1, 2)
    }
    save("worker_threads", {
        "dataset": "datasets_for_tests:blas_transform (two 256x256 matrix products a sample)",
        "segment": {"warmup_steps": 5, "steps": args.steps, "batch_size": 16},
        "samples_per_s": {name: spread(v) for name, v in speeds.items()},
        "busy_threads_per_worker": {name: spread(v) for name, v in busy.items()},
        "speedup_of_one_thread": speedup,
        "thread_pools": pools,
        "method": f"rotated rounds of the four configurations, {args.repeats} each, in one "
        "process (run_trial, as a verification run)",
    })  # fmt: skip


if __name__ == "__main__":
    main()
