"""Ray on the trial side: the function Tune runs, and the tasks of the other measurements.

This is the Ray boundary in the worker processes: the Tune config dict becomes a
:class:`LoaderConfig` here and nowhere else, and the outcome goes back as flat
dicts through ``tune.report``. Ceiling and verification measurements run as Ray
tasks (:func:`measure_task`, :func:`ceiling_task`, :func:`input_task`, started by
:class:`raytune_loader.tuner.RayMeasurer`) through the same
:func:`~raytune_loader.ranks.run_trial` (one process, or ``--ranks-per-node`` rank
processes around :func:`~raytune_loader.measure.run_trial`), so every figure comes
from one code path.
"""

from __future__ import annotations

import functools
import gc
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import psutil
import ray
import torch
from ray import tune

from raytune_loader.hardware import cpu_and_gpu_summary, hardware_class
from raytune_loader.job import DATA_SLOT, TrialJob
from raytune_loader.measure import InputRate, TrialOutcome
from raytune_loader.profile import Profile, profile
from raytune_loader.ranks import measure_ceiling, measure_input, run_trial
from raytune_loader.space import LoaderConfig

P = ParamSpec("P")
R = TypeVar("R")


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
    cpus = job.cpus_for(loader_config.num_workers)
    # in every report, early stops included
    node = {**_node(), "cpus_reserved": cpus, **({"ranks": job.ranks} if job.ranks > 1 else {})}

    def report(metrics: dict[str, Any]) -> None:
        tune.report({**metrics, **node})

    # A sample that never returns in the main process (num_workers=0) cannot be
    # interrupted from inside: past the limit and a grace period, end this trial's
    # process; Tune records the error and the search goes on.
    watchdog = threading.Timer(job.segment.give_up_s, os._exit, args=(3,))
    watchdog.daemon = True
    watchdog.start()
    try:
        outcome = run_trial(job, loader_config, report, slot=config.get(DATA_SLOT, 0))
    finally:
        watchdog.cancel()
    report(outcome.as_report())


# The measurement tasks run in Ray's reused worker processes: importing torch and this
# package costs about 3 s a process on 2 cores, paid once per worker rather than once
# per verification run (a default search makes about twenty). Each measurement starts
# its own loader, workers and model, and leaves nothing behind (``_afresh``); Ray sets
# each task's OMP_NUM_THREADS and CUDA_VISIBLE_DEVICES anew in a reused worker.


def _afresh(measurement: Callable[P, R]) -> Callable[P, R]:
    """``measurement``, then what it left freed: its objects collected, the CUDA
    allocator's cache handed back, torch's threads as the process had them."""

    @functools.wraps(measurement)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        threads = torch.get_num_threads()
        try:
            return measurement(*args, **kwargs)
        finally:
            gc.collect()
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()
            torch.set_num_threads(threads)

    return run


@ray.remote
@_afresh
def measure_task(job: TrialJob, config: LoaderConfig, slot: int) -> TrialOutcome:
    return run_trial(job, config, slot=slot)


@ray.remote
@_afresh
def profile_task(job: TrialJob, structures: list[LoaderConfig], cores: int) -> Profile:
    return profile(job, structures, cores)


@ray.remote
@_afresh
def ceiling_task(job: TrialJob, batch_size: int, windows: int) -> tuple[int, float]:
    return measure_ceiling(job, batch_size, windows)


@ray.remote
@_afresh
def input_task(job: TrialJob, config: LoaderConfig) -> InputRate:
    return measure_input(job, config)
