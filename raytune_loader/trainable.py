"""The trial as Ray Tune sees it: config dict in, metric dicts out.

This is the Ray boundary on the trial side: the Tune config dict becomes a
:class:`LoaderConfig` here and nowhere else, and the outcome goes back as flat
dicts through ``tune.report``. Ceiling and verification measurements run as Ray
tasks through the same :func:`~raytune_loader.measure.run_trial`, so every
figure comes from one code path.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import psutil
import ray
from ray import tune

from raytune_loader.hardware import cpu_and_gpu_summary, hardware_class
from raytune_loader.measure import (
    DATA_SLOT,
    TrialJob,
    TrialOutcome,
    last_line,
    measure_ceiling,
    run_trial,
)
from raytune_loader.space import LoaderConfig, reserved_cpus


def _node() -> dict[str, Any]:
    """Where this trial runs and that node's hardware class (trials.csv columns)."""
    node_id = ray.get_runtime_context().get_node_id()
    resources = next((n["Resources"] for n in ray.nodes() if n["NodeID"] == node_id), {})
    summary = cpu_and_gpu_summary()
    facts = {
        "node_id": node_id,
        "hostname": socket.gethostname(),
        "cpu_model": summary["cpu_model"],
        "node_cpus": resources.get("CPU", 0.0),
        "gpu_name": summary["gpu_name"] or "",
        "node_gpus": resources.get("GPU", 0.0),
        "ram_bytes": psutil.virtual_memory().total,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }
    return {**facts, "hardware_class": hardware_class(facts)}


def trial_fn(config: dict[str, Any], job: TrialJob) -> None:
    """Tune function trainable: one candidate configuration, one short training segment."""
    loader_config = LoaderConfig.from_trial_config(config)
    cpus = reserved_cpus(loader_config.num_workers, job.cpus_per_worker, job.node_cpus)
    node = {**_node(), "cpus_reserved": cpus}  # in every report, early stops included

    def report(metrics: dict[str, Any]) -> None:
        tune.report({**metrics, **node})

    # A sample that never returns in the main process (num_workers=0) cannot be
    # interrupted from inside: past the limit and a grace period, end this trial's
    # process; Tune records the error and the search goes on.
    grace = min(60.0, job.segment.time_limit_s)
    watchdog = threading.Timer(job.segment.time_limit_s + grace, os._exit, args=(3,))
    watchdog.daemon = True
    watchdog.start()
    try:
        outcome = run_trial(job, loader_config, report, slot=config.get(DATA_SLOT, 0))
    finally:
        watchdog.cancel()
    report(outcome.as_report())


@ray.remote(max_calls=1)
def _measure_task(job: TrialJob, config: LoaderConfig, slot: int) -> TrialOutcome:
    return run_trial(job, config, slot=slot)


@ray.remote(max_calls=1)
def _ceiling_task(job: TrialJob, batch_size: int) -> tuple[int, float]:
    return measure_ceiling(job, batch_size)


def _options(bundle: dict[str, float], node_id: str | None) -> dict[str, Any]:
    """Ray task options for one bundle, pinned to ``node_id`` when given."""
    options: dict[str, Any] = {
        "num_cpus": bundle.get("CPU", 1),
        "num_gpus": bundle.get("GPU", 0),
        "resources": {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
    }
    if node_id:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return options


def measure_once(
    job: TrialJob,
    config: LoaderConfig,
    bundle: dict[str, float],
    slot: int = 0,
    node_id: str | None = None,
) -> TrialOutcome:
    """Run one configuration as a Ray task with the given bundle and wait for it."""
    ref = _measure_task.options(**_options(bundle, node_id)).remote(job, config, slot)
    limit = job.segment.time_limit_s + min(60.0, job.segment.time_limit_s)
    try:
        outcome = ray.get(ref, timeout=limit)
    except ray.exceptions.GetTimeoutError:  # a sample that never returns, workers=0
        ray.cancel(ref, force=True)
        cpus = bundle.get("CPU", 1.0)
        detail = f"no result after {limit:.0f}s (--trial-timeout)"
        return TrialOutcome(config, cpus, 0, failure="timeout", detail=detail)
    except ray.exceptions.RayError as exc:  # the task crashed or its worker died
        cpus = bundle.get("CPU", 1.0)
        return TrialOutcome(config, cpus, 0, failure="error", detail=last_line(exc))
    return outcome


def ceiling_once(
    job: TrialJob, batch_size: int, bundle: dict[str, float], node_id: str | None = None
) -> tuple[int, float]:
    task = _ceiling_task.options(**_options(bundle, node_id))
    try:
        return ray.get(task.remote(job, batch_size))
    except ray.exceptions.RayTaskError as exc:
        raise exc.cause from None  # the task's own exception, with its one-line message
