"""The memory projection against a run ten times longer, on a million Python objects.

    python experiments/findings_memory.py [--steps 800] [--factor 10] [--repeats 2]

The dataset (tests/datasets_for_tests.py's ``python_objects``: a million path strings
and a million labels, read at random by two worker processes) makes each worker copy
the main process's pages as reference counts touch them. A short measurement's fit
projects one worker's copies from the end of its window to the samples a run
``--factor`` times longer reads; that run, measured after it, gives what the worker
really copied over the same samples read (its followed worker's readings), and the
memory of all its processes at its end against the short run's projection of it.
Short and long runs alternate, ``--repeats`` times. Writes
results/benchmarks/findings_memory.json: both figures and their ratio (target: within
2x), and the straight-line projection beside them (what the curve is for).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from _common import save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.machine import watch
from raytune_loader.measuring import memoryfit
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.measure import run_trial
from raytune_loader.sources.datasets import DatasetSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the dataset
CONFIG = LoaderConfig(32, 2, 2, False, True)


def job(steps: int, samples: int) -> TrialJob:
    return TrialJob(
        dataset=DatasetSpec("datasets_for_tests:python_objects"), model="small-cnn",
        segment=SegmentSpec(warmup_steps=5, steps=steps, report_every=steps),
        samples_per_trial=samples,
    )  # fmt: skip


def followed_copies(seen: watch.Watch, fit: memoryfit.MemoryFit) -> list[tuple[float, float]]:
    """(distinct samples the followed worker had read, bytes it had copied) over a run."""
    readings = [r for r in seen.readings if r.worker == watch.FOLLOWED and r.uss is not None]
    first = memoryfit._still_shared(readings[0])
    return [(memoryfit.distinct_reads(r.reads / seen.workers, None, fit.parts),
             first - memoryfit._still_shared(r)) for r in readings]  # fmt: skip


def at(points: list[tuple[float, float]], x: float) -> float:
    """Linear interpolation of ``points`` at ``x``."""
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / max(x1 - x0, 1e-9)
    return points[-1][1]


def compare(short: Any, long: Any) -> dict[str, Any]:
    fit = short.metrics.memory
    lfit, lseen = long.metrics.memory, long.metrics.watch
    read_short, read_long = fit.worker_reads, lfit.worker_reads
    shared = fit.shared_bytes[0]
    projected = fit.copied(read_short, read_long, shared)
    straight = min(fit.workers.copies * (read_long - read_short), shared)
    series = followed_copies(lseen, lfit)
    measured = at(series, read_long) - at(series, read_short)
    total_projected = fit.current_bytes + fit.epoch_growth(int(read_long * fit.parts))
    return {
        "short_distinct_reads_per_worker": read_short,
        "long_distinct_reads_per_worker": read_long,
        "copies_per_sample_bytes": fit.workers.copies,
        "objects_bytes": fit.objects_bytes,
        "projected_copies_bytes": projected,
        "measured_copies_bytes": measured,
        "ratio": projected / measured if measured else None,
        "straight_line_bytes": straight,
        "straight_line_ratio": straight / measured if measured else None,
        "projected_total_bytes": total_projected,
        "measured_total_bytes": lfit.current_bytes,
        "total_ratio": total_projected / lfit.current_bytes,
        "short_wall_s": short.metrics.wall_s,
        "long_wall_s": long.metrics.wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=800, help="measured steps of the short run")
    parser.add_argument("--factor", type=int, default=10, help="the long run's length over it")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    samples = (args.factor * args.steps + 10) * CONFIG.batch_size  # every read a new sample
    short_job, long_job = job(args.steps, samples), job(args.factor * args.steps, samples)
    rounds = []
    for repeat in range(args.repeats):
        short, long = run_trial(short_job, CONFIG), run_trial(long_job, CONFIG)
        assert short.metrics and long.metrics, (short.detail, long.detail)
        rounds.append(compare(short, long))
        figures = rounds[-1]
        print(f"round {repeat + 1}: projected {figures['projected_copies_bytes'] / 2**20:.0f} MiB, "
              f"measured {figures['measured_copies_bytes'] / 2**20:.0f} MiB, ratio "
              f"{figures['ratio']:.2f} (straight line {figures['straight_line_ratio']:.2f})",
              flush=True)  # fmt: skip
    ratios = [r["ratio"] for r in rounds if r["ratio"]]
    save("findings_memory", {
        "config": CONFIG.kwargs(),
        "dataset": "datasets_for_tests:python_objects (1,000,000 strings and 1,000,000 ints)",
        "short_steps": args.steps, "factor": args.factor, "samples_per_trial": samples,
        "rounds": rounds,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "target": "projected within 2x of measured (0.5 to 2)",
        "method": "one worker's copies (what it still shares with the main process, shrinking) "
        "from the short run's window end to the long run's reads: projected from the short "
        "run's fit, measured in the long run's readings of the same worker index",
    })  # fmt: skip


if __name__ == "__main__":
    main()
