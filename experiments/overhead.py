"""What the harness costs: the same configuration in a bare loop and as Tune trials.

    python experiments/overhead.py [--repeats 6] [--trials 5]

Bare: ``run_trial`` in this process, ``--repeats`` times. Tune: the search's own
trainable (reused actors, as in the search) in one Tuner of 1 trial and one of
``--trials`` trials, alternating with the bare runs so that drift hits both.
The per-trial fixed cost is the marginal wall time of a Tune trial,
(W_trials - W_1) / (trials - 1), minus a bare run's: it leaves out what a search
pays once (Tune's start-up) and counts what it pays per trial. Writes
results/benchmarks/overhead.json: samples/s in each and their ratio (target:
within 3%), the per-trial fixed cost (target: at most 2 s), Ray's start and
shutdown.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import ray
from ray import tune

from _common import default_job, save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.machine import hardware
from raytune_loader.measuring.measure import run_trial
from raytune_loader.tuning.tuner import RayCluster, trainable
from raytune_loader.verdict.selection import rotated


def local_cluster() -> RayCluster:
    cpus = hardware.usable_cpus()
    return RayCluster(None, node_cpus=cpus, gpus=0, max_node_gpus=0, nodes=1, joined=False)


def in_tune(job, config: LoaderConfig, storage: str, trials: int) -> tuple[list[float], float]:
    """(samples/s of each trial, wall seconds of Tuner.fit) for ``trials`` of ``config``."""
    tuner = tune.Tuner(
        trainable(job, 0, local_cluster()),
        param_space=config.kwargs(),
        tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
    )
    started = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - started
    return [result.metrics["samples_per_s"] for result in grid], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=6, help="bare runs and Tune runs of each")
    parser.add_argument("--trials", type=int, default=5, help="trials in the longer Tune run")
    args = parser.parse_args()
    if args.trials < 2:
        parser.error("--trials must be at least 2: the marginal trial is their difference")
    job = default_job()
    config = LoaderConfig(32, 2, 2, False, True)
    storage = tempfile.mkdtemp(prefix="overhead-")
    started = time.perf_counter()
    ray.init(
        address="local", num_cpus=hardware.usable_cpus(), include_dashboard=False,
        log_to_driver=False,
    )  # fmt: skip
    ray_start_s = time.perf_counter() - started
    bare, tuned, bare_wall = [], [], []
    walls: dict[int, list[float]] = {1: [], args.trials: []}
    try:
        # alternate which runs first, so neither always gets the warmer machine
        kinds = ["bare", "tune-1", f"tune-{args.trials}"]
        for repeat, kind in rotated(kinds, args.repeats):
            if kind == "bare":
                started = time.perf_counter()
                outcome = run_trial(job, config)
                bare_wall.append(time.perf_counter() - started)
                assert outcome.metrics is not None, outcome.detail
                bare.append(outcome.metrics.samples_per_s)
                speeds = [bare[-1]]
            else:
                trials = int(kind.split("-")[1])
                speeds, wall = in_tune(job, config, storage, trials)
                tuned.extend(speeds)
                walls[trials].append(wall)
            shown = ", ".join(f"{s:.0f}" for s in speeds)
            print(f"round {repeat + 1}: {kind:<7} {shown} samples/s", flush=True)
    finally:
        started = time.perf_counter()
        ray.shutdown()
        teardown_s = time.perf_counter() - started
    marginal = (statistics.median(walls[args.trials]) - statistics.median(walls[1])) / (
        args.trials - 1
    )
    save(
        "overhead",
        {
            "config": config.kwargs(),
            "bare_samples_per_s": bare,
            "tune_samples_per_s": tuned,
            "tune_over_bare": statistics.median(tuned) / statistics.median(bare),
            "target_within": 0.03,
            "ray_start_s": ray_start_s,
            "ray_shutdown_s": teardown_s,
            "bare_trial_wall_s": statistics.median(bare_wall),
            "tune_fit_wall_s": {str(k): v for k, v in walls.items()},
            "tune_marginal_trial_wall_s": marginal,
            "per_trial_fixed_cost_s": marginal - statistics.median(bare_wall),
            "target_fixed_cost_s": 2.0,
            "method": "marginal Tune trial (reused actors) minus a bare run_trial, medians",
        },
    )


if __name__ == "__main__":
    main()
