"""The trial as Ray Tune sees it: config dict in, metric dicts out.

This is the Ray boundary on the trial side: the Tune config dict becomes a
:class:`LoaderConfig` here and nowhere else, and the outcome goes back as flat
dicts through ``tune.report``. Ceiling and verification measurements run as Ray
tasks through the same :func:`~raytune_loader.measure.run_trial`, so every
figure comes from one code path.
"""

from __future__ import annotations

import socket
from typing import Any

import ray
from ray import tune

from raytune_loader.measure import (
    DATA_SLOT,
    TrialJob,
    TrialOutcome,
    measure_ceiling,
    run_trial,
)
from raytune_loader.space import LoaderConfig


def _node() -> dict[str, str]:
    return {"node_id": ray.get_runtime_context().get_node_id(), "hostname": socket.gethostname()}


def trial_fn(config: dict[str, Any], job: TrialJob) -> None:
    """Tune function trainable: one candidate configuration, one short training segment."""
    loader_config = LoaderConfig.from_trial_config(config)
    node = _node()

    def report(metrics: dict[str, Any]) -> None:
        tune.report({**metrics, **node})

    outcome = run_trial(job, loader_config, report, slot=config.get(DATA_SLOT, 0))
    report(outcome.as_report())


@ray.remote(max_calls=1)
def _measure_task(
    job: TrialJob, config: LoaderConfig, slot: int
) -> tuple[TrialOutcome, dict[str, str]]:
    return run_trial(job, config, slot=slot), _node()


@ray.remote(max_calls=1)
def _ceiling_task(job: TrialJob, batch_size: int) -> tuple[int, float]:
    return measure_ceiling(job, batch_size)


def measure_once(
    job: TrialJob, config: LoaderConfig, cpus: float, gpus: float, slot: int = 0
) -> TrialOutcome:
    """Run one configuration as a Ray task with the given reservation and wait for it."""
    task = _measure_task.options(num_cpus=cpus, num_gpus=gpus)
    outcome, _ = ray.get(task.remote(job, config, slot))
    return outcome


def ceiling_once(job: TrialJob, batch_size: int, gpus: float) -> tuple[int, float]:
    task = _ceiling_task.options(num_cpus=1, num_gpus=gpus)
    return ray.get(task.remote(job, batch_size))
