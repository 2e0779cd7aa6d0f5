"""What the harness costs: the same configuration in a bare loop and inside a Tune trial.

    python experiments/overhead.py [--repeats 6]

Writes results/benchmarks/overhead.json: samples/s in each and their ratio (target:
within 3%), and the per-trial fixed cost of Ray (start, trial start-up, teardown).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import ray
from ray import tune

from _common import default_job, save
from raytune_loader import hardware
from raytune_loader.measure import run_trial
from raytune_loader.selection import rotated
from raytune_loader.space import LoaderConfig
from raytune_loader.tuner import RayCluster, trainable


def local_cluster() -> RayCluster:
    cpus = hardware.usable_cpus()
    return RayCluster(None, node_cpus=cpus, gpus=0, max_node_gpus=0, nodes=1, joined=False)


def in_tune(job, config: LoaderConfig, storage: str) -> tuple[float, float]:
    """(samples/s, wall seconds of Tuner.fit) for one trial of ``config``."""
    tuner = tune.Tuner(
        trainable(job, 0, local_cluster()),
        param_space=config.kwargs(),
        tune_config=tune.TuneConfig(num_samples=1),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
    )
    started = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - started
    return grid[0].metrics["samples_per_s"], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    job = default_job()
    config = LoaderConfig(32, 2, 2, False, True)
    storage = tempfile.mkdtemp(prefix="overhead-")
    started = time.perf_counter()
    ray.init(num_cpus=hardware.usable_cpus(), include_dashboard=False, log_to_driver=False)
    ray_start_s = time.perf_counter() - started
    bare, tuned, bare_wall, tune_wall = [], [], [], []
    try:
        # alternate which runs first, so neither always gets the warmer machine
        for repeat, where in rotated(["bare", "tune"], args.repeats):
            if where == "bare":
                started = time.perf_counter()
                outcome = run_trial(job, config)
                bare_wall.append(time.perf_counter() - started)
                assert outcome.metrics is not None
                bare.append(outcome.metrics.samples_per_s)
                speed = bare[-1]
            else:
                speed, wall = in_tune(job, config, storage)
                tuned.append(speed)
                tune_wall.append(wall)
            print(f"round {repeat + 1}: {where:<4} {speed:.1f} samples/s", flush=True)
    finally:
        started = time.perf_counter()
        ray.shutdown()
        teardown_s = time.perf_counter() - started
    ratio = statistics.median(tuned) / statistics.median(bare)
    save(
        "overhead",
        {
            "config": config.kwargs(),
            "bare_samples_per_s": bare,
            "tune_samples_per_s": tuned,
            "tune_over_bare": ratio,
            "tune_over_bare_per_round": [t / b for t, b in zip(tuned, bare, strict=True)],
            "target_within": 0.03,
            "ray_start_s": ray_start_s,
            "ray_shutdown_s": teardown_s,
            "bare_trial_wall_s": statistics.median(bare_wall),
            "tune_trial_wall_s": statistics.median(tune_wall),
            "per_trial_fixed_cost_s": statistics.median(tune_wall) - statistics.median(bare_wall),
        },
    )


if __name__ == "__main__":
    main()
