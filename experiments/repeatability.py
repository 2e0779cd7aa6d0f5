"""How repeatable is a measurement, and does running trials side by side change the ranking?

1. One configuration measured N times in a row: coefficient of variation of samples/s.
2. The same set of configurations measured one at a time and two at a time (Ray
   started with twice the usable CPUs, so two trials really share the cores, as
   ``--max-concurrent 2`` would on this machine): Kendall tau between the rankings.

    python experiments/repeatability.py [--repeats 5]

Writes results/benchmarks/repeatability.json.
"""

from __future__ import annotations

import argparse
import statistics
from itertools import combinations

import ray

from _common import default_job, save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.machine import hardware
from raytune_loader.measuring.measure import run_trial
from raytune_loader.tuning.trainable import measure_task

CONFIGS = [
    LoaderConfig(32),
    LoaderConfig(32, 1, 1, False, False),
    LoaderConfig(32, 1, 4, False, True),
    LoaderConfig(32, 2, 1, False, False),
    LoaderConfig(32, 2, 2, False, True),
    LoaderConfig(32, 2, 8, False, True),
]


def kendall_tau(a: list[float], b: list[float]) -> float:
    concordant = discordant = 0
    for i, j in combinations(range(len(a)), 2):
        sign = (a[i] - a[j]) * (b[i] - b[j])
        concordant += sign > 0
        discordant += sign < 0
    pairs = len(a) * (len(a) - 1) / 2
    return (concordant - discordant) / pairs


def speed(outcome) -> float:
    assert outcome.metrics is not None, outcome.detail
    return outcome.metrics.samples_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60, help="measured steps (the search's)")
    args = parser.parse_args()
    job = default_job(steps=args.steps)
    config = LoaderConfig(32, 2, 2, False, True)
    # Burn-in: the first segment in a fresh process runs ~15% slower (first worker fork,
    # allocator and page-cache warm-up). Every verification run and trial starts in a
    # process of its own, so all pay it alike; here it would only inflate the spread.
    burn_in = speed(run_trial(job, config))
    print(f"burn-in (not counted): {burn_in:.1f} samples/s", flush=True)
    repeated = []
    for i in range(args.repeats):
        repeated.append(speed(run_trial(job, config)))
        print(f"repeat {i + 1}/{args.repeats}: {repeated[-1]:.1f} samples/s", flush=True)
    cv = statistics.stdev(repeated) / statistics.mean(repeated)

    usable = hardware.usable_cpus()
    ray.init(address="local", num_cpus=2 * usable, include_dashboard=False, log_to_driver=False)
    try:
        task = measure_task.options(num_cpus=usable)
        sequential = [speed(ray.get(task.remote(job, c, 0))) for c in CONFIGS]
        print("sequential:", [round(s) for s in sequential], flush=True)
        concurrent = []
        for first, second in zip(CONFIGS[::2], CONFIGS[1::2], strict=True):
            pair = ray.get([task.remote(job, first, 0), task.remote(job, second, 0)])
            concurrent += [speed(outcome) for outcome in pair]
        print("two at a time:", [round(s) for s in concurrent], flush=True)
    finally:
        ray.shutdown()
    save(
        "repeatability",
        {
            "config": config.kwargs(),
            "measured_steps": args.steps,
            "burn_in_samples_per_s": burn_in,
            "samples_per_s": repeated,
            "cv_samples_per_s": cv,
            "target_cv": 0.05,
            "ranking": {
                "configs": [c.label() for c in CONFIGS],
                "sequential_samples_per_s": sequential,
                "concurrent_samples_per_s": concurrent,
                "kendall_tau": kendall_tau(sequential, concurrent),
                "concurrent_over_sequential": statistics.median(
                    c / s for c, s in zip(concurrent, sequential, strict=True)
                ),
            },
        },
    )


if __name__ == "__main__":
    main()
