"""A tabular benchmark of the widened space: configurations measured once each, and the
profile, so searches can be replayed on it (experiments/search_efficiency.py).

Every structure of the space (decoder x transfer x worker kind, and no workers) is
covered, the rest of each structure drawn at random (seeded). Each configuration is
one trial in this process (as the bench measures), with its interim reports and the
trial-seconds each took; the cost model's prediction is kept beside it.

    python experiments/grid.py [--configs 72] [--seed 0]

Writes results/benchmarks/grid.json.
"""

from __future__ import annotations

import argparse
import random
import time

from _common import default_job, save
from raytune_loader.machine import hardware
from raytune_loader.measuring.measure import measure_ceiling, run_trial
from raytune_loader.measuring.profile import profile
from raytune_loader.measuring.steady import above_ceiling
from raytune_loader.tuning.costmodel import CostModel, median_error
from raytune_loader.tuning.space import SearchSpace

OBJECTIVE = "samples_per_s"


def the_space(job) -> SearchSpace:  # noqa: ANN001
    source = job.dataset.source
    cores = hardware.usable_cpus()
    return SearchSpace(
        max_workers=cores, batch_sizes=(32,), cuda=False, usable_cpus=cores, pipeline=True,
        decodes=source.decoders(job.dataset, False), thread_workers=True,
    )  # fmt: skip


def chosen(space: SearchSpace, count: int, seed: int) -> list:  # noqa: ANN001
    """Every structure's configurations, in turn, until ``count``: each structure is
    covered and the rest are drawn at random within structures."""
    rng = random.Random(seed)
    pools = [rng.sample(configs, len(configs)) for configs in space.structures().values()]
    picked = []
    while len(picked) < count and any(pools):
        for pool in pools:
            if pool and len(picked) < count:
                picked.append(pool.pop())
    return picked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--configs", type=int, default=72)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    job = default_job(steps=args.steps)
    space = the_space(job)
    _, ceiling = measure_ceiling(job, 32)
    job = type(job)(**{**vars(job), "ceilings": {32: ceiling}})
    structures = [configs[0] for configs in space.structures().values()]
    measured_profile = profile(job, [c for c in structures if c.num_workers], space.usable_cpus)
    model = CostModel(measured_profile, job.ceilings)
    points = []
    for index, config in enumerate(chosen(space, args.configs, args.seed), 1):
        reports: list[tuple[float, float]] = []
        started = time.perf_counter()

        def report(metrics: dict, reports: list = reports, started: float = started) -> None:
            reports.append((metrics[OBJECTIVE], time.perf_counter() - started))

        outcome = run_trial(job, config, report)
        seconds = time.perf_counter() - started
        value = outcome.metrics.samples_per_s if outcome.metrics else 0.0
        held = outcome.metrics.steady if outcome.metrics else None
        ratio = outcome.metrics.steady_ratio if outcome.metrics else None
        reports.append((value, seconds))
        predicted = model.predict(config)
        points.append({
            "config": {**config.kwargs(), **config.pipeline(), **config.worker_init(),
                       "workers": config.workers},
            "label": config.label(), "samples_per_s": value, "reports": reports,
            "seconds": seconds, "failure": outcome.failure, "steady": held,
            "steady_ratio": ratio,
            "predicted_samples_per_s": predicted.samples_per_s if predicted else None,
            "bound": predicted.bound if predicted else None,
        })  # fmt: skip
        print(f"{index:3d} {config.label():<80} {value:6.1f} "
              f"(predicted {predicted.samples_per_s if predicted else float('nan'):6.1f})",
              flush=True)  # fmt: skip
    # the ceiling is a best case: measured again after the grid, the higher stands, and
    # a point above it beyond noise is a defect, said and left out of the figures
    ceiling = max(ceiling, measure_ceiling(job, 32)[1])
    for point in points:
        point["bounds"] = above_ceiling(point["samples_per_s"], ceiling)
        if point["bounds"]:
            print(f"defect: {point['label']}: {point['bounds']}", flush=True)
    pairs = [(p["predicted_samples_per_s"], p["samples_per_s"]) for p in points
             if p["predicted_samples_per_s"] and p["samples_per_s"]
             and not p["bounds"]]  # fmt: skip
    save("grid", {
        "objective": OBJECTIVE, "dataset": job.dataset.name, "model": job.model,
        "batch_size": 32, "steps": args.steps, "seed": args.seed,
        "space_size": len(space.grid()), "structures": len(space.structures()),
        "ceiling_samples_per_s": ceiling, "profile": measured_profile.as_dict(),
        "model_median_error": median_error(pairs), "points": points,
        "defects": sum(1 for p in points if p["bounds"]),
        "not_steady": sum(1 for p in points if p["steady"] is False),
        "how": "python experiments/grid.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
    })  # fmt: skip


if __name__ == "__main__":
    main()
