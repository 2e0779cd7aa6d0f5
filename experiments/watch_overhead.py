"""What watching costs: the same measurement with the processes watched and not, in one run.

    python experiments/watch_overhead.py [--repeats 16]

The default job (the embedded dataset, its model and segment) with one and with two
worker processes; each measurement runs with its watcher (memory read every 0.2 s,
one worker's private memory within 1% of the CPUs, the threads at the window's
ends) and with it switched off (``SegmentSpec.watch``), in rotated rounds. Writes
results/benchmarks/watch_overhead.json: samples/s watched and not, their ratio
(median and mean of the rounds' ratios, with the mean's standard error; target:
within 2%), and the watcher's readings' CPU time over the time it watched. A round's
runs differ by a few percent either way on a shared 2-core machine: the rounds'
spread says how far one figure can be trusted.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from _common import default_job, save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.measure import run_trial
from raytune_loader.verdict.selection import rotated


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=16)
    args = parser.parse_args()
    job = default_job()
    unwatched = replace(job, segment=replace(job.segment, watch=False))
    figures = {}
    for workers in (1, 2):
        config = LoaderConfig(32, workers, 2, False, True)
        runs: dict[str, list[float]] = {"watched": [], "not watched": []}
        cost = []
        for repeat, name in rotated(list(runs), args.repeats):
            outcome = run_trial(job if name == "watched" else unwatched, config)
            assert outcome.metrics is not None, outcome.detail
            runs[name].append(outcome.metrics.samples_per_s)
            seen = outcome.metrics.watch
            if name == "watched" and seen is not None and seen.watched_s:
                cost.append(seen.cost_s / seen.watched_s)
            print(f"{workers} workers, round {repeat + 1}: {name:<12} "
                  f"{runs[name][-1]:6.0f} samples/s", flush=True)  # fmt: skip
        ratios = [w / n for w, n in zip(runs["watched"], runs["not watched"], strict=True)]
        error = statistics.stdev(ratios) / len(ratios) ** 0.5
        figures[f"{workers} workers"] = {
            "config": config.kwargs(),
            "samples_per_s": {name: spread(values) for name, values in runs.items()},
            "watched_over_not": spread(ratios),
            "watched_over_not_mean": statistics.mean(ratios),
            "watched_over_not_standard_error": error,
            "median_ratio_of_medians": statistics.median(runs["watched"])
            / statistics.median(runs["not watched"]),
            "reading_time_over_watched_time": spread(cost),
        }
    save("watch_overhead", {
        **figures,
        "target": "watched within 2% of not watched",
        "segment": {"warmup_steps": job.segment.warmup_steps, "steps": job.segment.steps},
        "method": f"{args.repeats} rotated rounds per configuration, watched then not and "
        "the other way round, run_trial in one process; a round's ratio is its watched run "
        "over its unwatched one",
    })  # fmt: skip


if __name__ == "__main__":
    main()
