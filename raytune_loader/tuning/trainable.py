"""Ray on the trial side: the function Tune runs, the tasks of the other measurements,
and what of the driver's environment the trials carry (no credential).

This is the Ray boundary in the worker processes: the Tune config dict becomes a
:class:`LoaderConfig` here and nowhere else, and the outcome goes back as flat
dicts through ``tune.report``. Ceiling and verification measurements run as Ray
tasks (:data:`MEASURE`, :data:`CEILING`, :data:`INPUT`, :data:`PROFILE`, started by
:class:`raytune_loader.tuning.tuner.RayMeasurer`) through the same
:func:`~raytune_loader.measuring.ranks.run_trial` (one process, or ``--ranks-per-node`` rank
processes around :func:`~raytune_loader.measuring.measure.run_trial`), so every figure comes
from one code path.

Two things a reused Ray worker could carry from one measurement to the next are kept
out here. CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when it starts in a process, and
Ray sets it anew for every task: a worker whose CUDA started in an earlier task would
measure on that task's GPU (:class:`CudaStart` refuses that, and on a node with several
GPUs each measurement runs in a worker of its own, :class:`Task`). A module the
configuration needs that is not installed (``torchdata`` for thread workers) is the
measurement's one-line failure (``missing_module``), not a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import psutil
import ray
import torch
from ray import tune

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import DataPipelineError, TrialFailure, last_line
from raytune_loader.machine.hardware import cpu_and_gpu_summary, hardware_class
from raytune_loader.measuring.job import DATA_SLOT, TrialJob
from raytune_loader.measuring.outcomes import TrialOutcome
from raytune_loader.measuring.profile import profile
from raytune_loader.measuring.ranks import measure_ceiling, measure_input, run_trial

P = ParamSpec("P")
R = TypeVar("R")
VISIBLE = "CUDA_VISIBLE_DEVICES"


class CudaStart:
    """The GPUs this process's CUDA started on (``CUDA_VISIBLE_DEVICES`` then), against
    the ones Ray gives each measurement it runs here."""

    def __init__(self) -> None:
        self.started_with: str | None = None  # the variable's value; None: unset
        self.started = False

    def check(self, given: str | None) -> None:
        """Before a measurement given the GPUs ``given``: a DataPipelineError when CUDA
        started here on others, which this process can no longer leave."""
        if self.started and given != self.started_with:
            raise DataPipelineError(
                "gpu_assignment",
                f"this Ray worker's CUDA started with {VISIBLE}={self.started_with!r} and Ray "
                f"gave this measurement {given!r}: it would run on another measurement's GPU; "
                "a measurement on a node with several GPUs needs a worker of its own "
                "(tuner.RayMeasurer starts one): report this",
            )

    def note(self, given: str | None, cuda_started: bool) -> None:
        """After a measurement given ``given``: CUDA, if it started in it, started there."""
        if cuda_started and not self.started:
            self.started, self.started_with = True, given


PROCESS_CUDA = CudaStart()  # this process's; the measurements below check against it


def _process_cuda() -> CudaStart:
    # looked up by name, so a measurement pickled by value to a worker (cloudpickle
    # copies a closure's globals) checks the worker's own record, not a copy of ours
    return PROCESS_CUDA


def _guarded(measurement: Callable[P, R]) -> Callable[P, R]:
    """``measurement`` on the GPUs Ray gave it (:class:`CudaStart`), with a module it
    needs that is not installed as its one-line failure (``missing_module``)."""

    @functools.wraps(measurement)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        given = os.environ.get(VISIBLE)
        _process_cuda().check(given)
        try:
            return measurement(*args, **kwargs)
        except ModuleNotFoundError as exc:
            name = (exc.name or "").split(".")[0] or "the module it names"
            raise DataPipelineError(
                "missing_module",
                f"{last_line(exc)}: this configuration needs {name}; install it where the "
                f"trials run (pip install {name}) or leave what needs it out of the search",
            ) from None
        finally:
            _process_cuda().note(given, torch.cuda.is_initialized())

    return run


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
    cpus = job.cpus_reserved(loader_config)
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
        outcome = _guarded(run_trial)(job, loader_config, report, slot=config.get(DATA_SLOT, 0))
    except TrialFailure as exc:  # a module it needs is missing, or the GPU is not Ray's
        outcome = TrialOutcome(loader_config, cpus, 0, failure=exc.reason, detail=str(exc))
    finally:
        watchdog.cancel()
    report(outcome.as_report())


# The measurement tasks run in Ray's reused worker processes: importing torch and this
# package costs about 3 s a process on 2 cores, paid once per worker rather than once
# per verification run (a default search makes about twenty). Each measurement starts
# its own loader, workers and model, and leaves nothing behind (``_afresh``); Ray sets
# each task's OMP_NUM_THREADS and CUDA_VISIBLE_DEVICES anew in a reused worker, which
# CUDA reads only once per process: on a node with several GPUs a measurement with a
# GPU runs in a worker of its own (``Task.alone``).


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


@dataclass(frozen=True)
class Task:
    """One kind of measurement as a Ray task: in a reused worker, or in a worker of its
    own that ends with it (``max_calls=1``), for a GPU measurement on a node with
    several GPUs, where a reused worker's CUDA would stay on its first task's GPU."""

    reused: Any
    alone: Any

    @classmethod
    def of(cls, measurement: Callable[..., Any]) -> Task:
        """The task of ``kind`` (``MEASURE``, ``CEILING``...) as a Ray remote function."""
        run = _afresh(_guarded(measurement))
        return cls(ray.remote(run), ray.remote(max_calls=1)(run))

    def on(self, gpus: float, node_gpus: float) -> Any:
        """The remote function for a measurement of ``gpus`` on nodes of ``node_gpus``."""
        return self.alone if gpus and node_gpus > 1 else self.reused


def _measure(job: TrialJob, config: LoaderConfig, slot: int) -> TrialOutcome:
    return run_trial(job, config, slot=slot)


MEASURE = Task.of(_measure)
PROFILE = Task.of(profile)
CEILING = Task.of(measure_ceiling)
INPUT = Task.of(measure_input)
measure_task = MEASURE.reused  # a verification run in a reused worker (experiments use it)


# Tune copies these into each trial's runtime_env, which Ray's runtime_env agent logs
# (session_*/logs/runtime_env_agent.log, world-readable): our own instance's trials
# inherit them, a cluster's read with their node's own (docs/object_storage.md)
CREDENTIAL_VARIABLES = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                        "AWS_SECURITY_TOKEN"}  # fmt: skip


@contextlib.contextmanager
def credentials_kept_out_of_ray() -> Iterator[None]:
    """Tune's trials made meanwhile carry none of :data:`CREDENTIAL_VARIABLES`."""
    try:
        from ray.tune.execution import class_cache
    except ImportError:  # a Ray that moved it (tests/test_api.py reads the logs)
        class_cache = None
    forwarded = getattr(class_cache, "ENV_VARS_TO_PROPAGATE", None)
    if forwarded is not None:
        class_cache.ENV_VARS_TO_PROPAGATE = set(forwarded) - CREDENTIAL_VARIABLES
    try:
        yield
    finally:
        if forwarded is not None:
            class_cache.ENV_VARS_TO_PROPAGATE = forwarded
