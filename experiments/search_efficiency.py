"""How much of a grid's cost does each search method need to find a near-best configuration?

A tabular benchmark: the configurations of the widened space that
experiments/grid.py measured once each (results/benchmarks/grid.json, every
structure covered), with their interim reports and the trial-seconds each took.
Each method is replayed on that table, with the product's own ``LoaderSearcher``:

- ``model``: the cost model built from the grid's own profile (its seconds are
  charged), the structures' predicted bests first, TPE around them, proposals the
  model rules out skipped;
- ``tpe``: TPE after the baselines;
- ``random``: random proposals after the baselines;

each with ASHA's rule (a rung at each report, reduction factor 2), as in a search;
and plain random sampling without early stopping. A proposal outside the table is
measured as its nearest configuration of the table (the same structure first, then
the closest worker count, then the fewest other differences), for every method
alike. A method's cost is the trial-seconds of what it ran (a stopped trial costs
up to its last report); it has *reached* the target when it has run to completion
a configuration within 3% of the table's best.

    python experiments/search_efficiency.py [--seeds 9] [--grid results/benchmarks/grid.json]

Writes results/benchmarks/search_efficiency.json: the median budget fraction per
method, per seed, and the model's median prediction error over the table.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

import optuna

from _common import RESULTS, save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.profile import Profile
from raytune_loader.tuning.costmodel import CostModel, median_error
from raytune_loader.tuning.searcher import LoaderSearcher
from raytune_loader.tuning.space import SearchSpace

TOLERANCE = 0.03


@dataclass(frozen=True)
class Point:
    config: LoaderConfig
    reports: tuple[tuple[float, float], ...]  # (samples/s, trial-seconds so far); last final

    @property
    def final(self) -> float:
        return self.reports[-1][0]

    @property
    def cost(self) -> float:
        return self.reports[-1][1]


def load(path: Path) -> tuple[list[Point], dict]:
    grid = json.loads(path.read_text())
    points = [
        Point(LoaderConfig.from_dict(_loader_keys(p["config"])), tuple(map(tuple, p["reports"])))
        for p in grid["points"]
        if p["samples_per_s"] > 0 and not p.get("bounds")  # a defect is not a figure
    ]
    return points, grid


def _loader_keys(recorded: dict) -> dict:
    """grid.json's config: the loader keys and the pipeline section's (start_method is the
    pipeline section's name of multiprocessing_context)."""
    values = {k: v for k, v in recorded.items() if k not in ("start_method", "in_order")}
    values["in_order"] = recorded.get("in_order", True)
    return values


def distance(a: LoaderConfig, b: LoaderConfig) -> float:
    def kind(c: LoaderConfig) -> str:
        return c.workers if c.num_workers else "none"

    same = (a.decode, a.transfer, kind(a)) == (b.decode, b.transfer, kind(b))
    keys = (
        "prefetch_factor",
        "persistent_workers",
        "in_order",
        "multiprocessing_context",
        "worker_threads",
    )
    others = sum(getattr(a, k) != getattr(b, k) for k in keys)
    return (0 if same else 100) + 10 * abs(a.num_workers - b.num_workers) + others


def nearest(table: list[Point], config: LoaderConfig) -> Point:
    return min(table, key=lambda p: distance(p.config, config))


def replay(
    table: list[Point], space: SearchSpace, method: str, seed: int, target: float,
    model: CostModel | None, profile_s: float,
) -> float:  # fmt: skip
    """Trial-seconds a search of ``method`` + ASHA spends until it completes a target."""
    searcher = LoaderSearcher(space, "samples_per_s", seed, method=method, model=model)
    rungs: dict[int, list[float]] = {}
    spent = profile_s if method == "model" else 0.0
    for trial in range(len(table) * 4):
        proposal = searcher.suggest(f"t{trial}")
        point = nearest(table, LoaderConfig.from_trial_config(proposal))
        value, stopped = point.final, False
        for rung, (interim, seconds) in enumerate(point.reports[:-1]):
            recorded = rungs.setdefault(rung, [])
            recorded.append(interim)
            cutoff = statistics.quantiles(recorded, n=2)[0] if len(recorded) > 1 else -1.0
            if interim < cutoff:  # ASHA: below the top half of its rung
                spent += seconds
                value, stopped = interim, True
                break
        searcher.on_trial_complete(f"t{trial}", {"samples_per_s": value, "final": not stopped})
        if not stopped:
            spent += point.cost
            if point.final >= target:
                return spent
    return spent


def replay_plain_random(table: list[Point], seed: int, target: float) -> float:
    rng = random.Random(seed)
    spent = 0.0
    while True:
        point = rng.choice(table)
        spent += point.cost
        if point.final >= target:
            return spent


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=9)
    parser.add_argument("--grid", type=Path, default=RESULTS / "grid.json")
    args = parser.parse_args()
    table, grid = load(args.grid)
    profile = Profile.from_dict(grid["profile"])
    model = CostModel(profile, {grid["batch_size"]: grid["ceiling_samples_per_s"]})
    decodes = tuple(sorted({p.config.decode for p in table}, key=["pil", "tensor"].index))
    space = SearchSpace(
        max_workers=max(p.config.num_workers for p in table),
        batch_sizes=(grid["batch_size"],), cuda=False, usable_cpus=profile.cores,
        pipeline=True, decodes=decodes, thread_workers=True,
    )  # fmt: skip
    best = max(p.final for p in table)
    target = best * (1 - TOLERANCE)
    total = sum(p.cost for p in table)
    per_seed: dict[str, list[float]] = {}
    for method in ("model", "tpe", "random"):
        per_seed[method] = [
            replay(table, space, method, seed, target, model, profile.seconds) / total
            for seed in range(args.seeds)
        ]
    per_seed["random_without_asha"] = [
        replay_plain_random(table, seed, target) / total for seed in range(args.seeds)
    ]
    medians = {method: statistics.median(values) for method, values in per_seed.items()}
    pairs = [(model.predict(p.config).samples_per_s, p.final) for p in table
             if model.predict(p.config)]  # fmt: skip
    save(
        "search_efficiency",
        {
            "objective": "samples_per_s",
            "grid": str(args.grid.name),
            "grid_points": len(table),
            "space_size": grid.get("space_size"),
            "grid_trial_seconds": total,
            "grid_best": best,
            "within": TOLERANCE,
            "configs_within_3pct": sum(p.final >= target for p in table),
            "budget_fraction_to_within_3pct": medians,
            "model_vs_random": medians["model"] / medians["random"],
            "model_median_error_over_the_grid": median_error(pairs),
            "per_seed": per_seed,
            "seeds": args.seeds,
            "method": "tabular replay of grid.json with raytune_loader's LoaderSearcher and "
            "ASHA's rule simulated on the interim reports; a proposal outside the table is "
            "measured as its nearest configuration; the model's profile seconds are charged",
            "targets": {
                "model_at_most": 0.25,
                "model_vs_random_at_most": 0.5,
                "model_median_error_at_most": 0.15,
            },  # fmt: skip
        },
    )


if __name__ == "__main__":
    main()
