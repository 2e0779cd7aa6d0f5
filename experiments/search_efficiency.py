"""How much of a grid's cost does the search need to find a near-best configuration?

1. Ground truth: every point of a reduced space (num_workers 0..2 x prefetch_factor
   x persistent_workers x batch size 16/32 on this machine) is measured once, with
   its interim reports and the trial-seconds each report took.
2. Replay on that table (a tabular benchmark, as in HPO research): raytune_loader's
   searcher (the real ``LoaderSearcher``: TPE, baselines first, no config measured
   twice) with ASHA's rule (rungs at each report, reduction factor 2), and plain
   random search without early stopping, each with several seeds. A method's cost
   is the trial-seconds of what it ran (a stopped trial costs up to its last
   report); it has *reached* the target when it has run to completion a
   configuration whose measured objective is within 3% of the grid's best.

    python experiments/search_efficiency.py [--seeds 5]

Writes results/benchmarks/search_efficiency.json with budget_fraction_to_within_3pct
per method (median over seeds; fraction of the grid's total trial-seconds).
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from dataclasses import dataclass, replace

import optuna

from _common import default_job, save
from raytune_loader.measure import run_trial
from raytune_loader.searcher import LoaderSearcher
from raytune_loader.space import LoaderConfig, SearchSpace

OBJECTIVE = "samples_per_s"  # on a CPU, util with a ceiling ranks exactly like it
TOLERANCE = 0.03


@dataclass(frozen=True)
class Point:
    config: LoaderConfig
    reports: tuple[tuple[float, float], ...]  # (objective, trial-seconds so far), last is final

    @property
    def final(self) -> float:
        return self.reports[-1][0]

    @property
    def cost(self) -> float:
        return self.reports[-1][1]


def measure_grid(job, space: SearchSpace) -> dict[tuple, Point]:
    grid: dict[tuple, Point] = {}
    combos = list(itertools.product(range(space.max_workers + 1), (1, 2, 4, 8), (True, False),
                                     space.batch_sizes))  # fmt: skip
    for workers, prefetch, persistent, batch in combos:
        config = LoaderConfig.from_dict(
            {"num_workers": workers, "prefetch_factor": prefetch, "persistent_workers": persistent}
            if workers
            else {"num_workers": 0},
            batch_size=batch,
        )
        key = key_of(config)
        if key in grid:
            continue
        grid[key] = measure_point(job, config)
        print(f"{len(grid):2d} {config.label():<60} {OBJECTIVE}={grid[key].final:.3f}", flush=True)
    return grid


def measure_point(job, config: LoaderConfig) -> Point:
    """One trial of ``config`` with the objective and elapsed seconds at every report."""
    reports: list[tuple[float, float]] = []
    started = time.perf_counter()

    def report(metrics: dict) -> None:
        reports.append((metrics[OBJECTIVE], time.perf_counter() - started))

    outcome = run_trial(job, config, report)
    assert outcome.metrics is not None, outcome.detail
    reports.append((getattr(outcome.metrics, OBJECTIVE), time.perf_counter() - started))
    return Point(config, tuple(reports))


def key_of(config: LoaderConfig) -> tuple:
    return tuple(sorted(config.kwargs().items()))


def replay_tpe(
    grid: dict[tuple, Point], space: SearchSpace, seed: int, target: float, baselines: bool = True
) -> float:
    """Trial-seconds raytune_loader's searcher + ASHA spends until it completes a target."""
    searcher = LoaderSearcher(space, OBJECTIVE, seed, enqueue_baselines=baselines)
    rungs: dict[int, list[float]] = {}
    spent = 0.0
    for trial in range(len(grid) * 3):
        config = LoaderConfig.from_trial_config(searcher.suggest(f"t{trial}"))
        point = grid[key_of(config)]
        value, stopped = point.final, False
        for rung, (interim, seconds) in enumerate(point.reports[:-1]):
            recorded = rungs.setdefault(rung, [])
            recorded.append(interim)
            cutoff = statistics.quantiles(recorded, n=2)[0] if len(recorded) > 1 else -1.0
            if interim < cutoff:  # ASHA: below the top 1/2 of its rung
                spent += seconds
                value, stopped = interim, True
                break
        searcher.on_trial_complete(f"t{trial}", {OBJECTIVE: value})
        if not stopped:
            spent += point.cost
            if point.final >= target:
                return spent
    return spent


def replay_random(grid: dict[tuple, Point], seed: int, target: float) -> float:
    rng = random.Random(seed)
    points = list(grid.values())
    spent = 0.0
    while True:
        point = rng.choice(points)
        spent += point.cost
        if point.final >= target:
            return spent


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=9)
    args = parser.parse_args()
    job = default_job()
    job = replace(job, segment=replace(job.segment, report_every=20))  # the search's rungs
    space = SearchSpace(max_workers=min(2, int(job.node_cpus)), batch_sizes=(16, 32), cuda=False,
                        usable_cpus=int(job.node_cpus))  # fmt: skip
    grid = measure_grid(job, space)
    best = max(p.final for p in grid.values())
    target = best * (1 - TOLERANCE)
    total = sum(p.cost for p in grid.values())
    tpe = [replay_tpe(grid, space, seed, target) / total for seed in range(args.seeds)]
    alone = [replay_tpe(grid, space, seed, target, False) / total for seed in range(args.seeds)]
    rnd = [replay_random(grid, seed, target) / total for seed in range(args.seeds)]
    save(
        "search_efficiency",
        {
            "objective": OBJECTIVE,
            "grid_points": len(grid),
            "grid_trial_seconds": total,
            "grid_best": best,
            "within": TOLERANCE,
            "configs_within_3pct": sum(p.final >= target for p in grid.values()),
            "budget_fraction_to_within_3pct": {
                "raytune_loader": statistics.median(tpe),
                "tpe_asha_without_baselines": statistics.median(alone),
                "random": statistics.median(rnd),
            },
            "per_seed": {"raytune_loader": tpe, "tpe_asha_without_baselines": alone, "random": rnd},
            "method": "tabular replay of the measured grid; TPE via raytune_loader's searcher, "
            "ASHA rule simulated on the interim reports",
            "target": {"raytune_loader_at_most": 0.35, "better_than_random": True},
        },
    )


if __name__ == "__main__":
    main()
