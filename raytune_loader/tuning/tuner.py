"""Ray on the driver side: start or join Ray, run the Tune search, run measurements.

Every driver-side Ray and Tune call lives here; the trial side (the function
Tune runs and the Ray tasks of the ceiling and verification) is
:mod:`raytune_loader.tuning.trainable`, and the Optuna searcher Tune drives is
:mod:`raytune_loader.tuning.searcher`. The search is that searcher with ASHA on the
reporting interval and one Ray bundle per trial of
``min(1 + cpus_per_worker x num_workers, node CPUs)`` CPUs plus the fractional
GPU; a Ray Data candidate's trial holds a placement group of that bundle and one per
actor (:meth:`~raytune_loader.engines.base.Engine.bundles`), which Tune's group gives the
trial's Ray Data actors (it captures the trial's child tasks). Tune's results become
:class:`~raytune_loader.measuring.records.TrialRecord`s here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from raytune_loader.candidates.config import CONFIG_KEYS, LoaderConfig
from raytune_loader.engines import engine_of
from raytune_loader.errors import ConfigError, DataPipelineError, RaytuneLoaderError, last_line
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.measure import CEILING_WINDOWS
from raytune_loader.measuring.measurer import Measurer
from raytune_loader.measuring.outcomes import InputRate, TrialOutcome
from raytune_loader.measuring.profile import Profile, receiver
from raytune_loader.measuring.records import TrialRecord, record_from_report
from raytune_loader.raydata.reservation import is_remote, remote_cpus
from raytune_loader.tuning import ray_logs as logs
from raytune_loader.tuning.costmodel import CostModel
from raytune_loader.tuning.searcher import LoaderSearcher
from raytune_loader.tuning.space import SearchSpace
from raytune_loader.tuning.trainable import (
    CEILING,
    INPUT,
    MEASURE,
    PROFILE,
    Task,
    credentials_kept_out_of_ray,
    trial_fn,
)

log = logging.getLogger(__name__)
NODE_TYPE_SHARE = 0.001  # requesting a custom resource pins a bundle to nodes that carry it
REUSE_WAIT_S = 180  # see start_ray
# Ray ends a task's worker after 1 s idle once the trials hold the node's CPUs, so the
# worker that measured the ceiling (torch imported) died during the search and
# verification started a new one: 8 of a tiny search's 65 s on 2 cores. Our own
# instance keeps idle workers for a day; on a joined cluster its own settings rule.
IDLE_WORKER_KEEP_MS = 24 * 3600 * 1000
# Ray starts its workers at niceness 15, below its own daemons and anything else on the
# machine at the default priority, which a training job runs at: beside two busy
# processes at niceness 10 a tiny search took 208 s against 91 s, and its first trial
# trained 24 against 78 samples/s (results/benchmarks/worker_priority.json).
# Our own instance's workers keep the driver's priority; a joined cluster keeps its own.
WORKER_NICENESS = 0
# Ray starts a Python worker per CPU for the first driver, and ray.init waits for them.
# They carry no runtime_env; every task and trial of a search carries one (the driver's
# env_vars below, Tune's own for its trials), so none of them ever runs anything: 2 idle
# processes on 2 cores, one per CPU on any node. Our own instance prestarts none; Ray
# starts workers as tasks and trials ask (results/benchmarks/worker_prestart.json). A
# joined cluster keeps its own settings.
PRESTART_WORKERS = False


@dataclass(frozen=True)
class RayCluster:
    """The nodes trials may run on (all, or those carrying ``--node-type``)."""

    dashboard_url: str | None
    node_cpus: float  # CPUs of the largest eligible node: the cap of any one trial's bundle
    gpus: float  # GPUs over the eligible nodes
    max_node_gpus: float  # GPUs of the eligible node with the most
    nodes: int
    joined: bool  # an existing cluster (--address), not a local instance of our own
    node_type: str | None = None
    remote_cpus: float = 0.0  # CPUs of the nodes beyond the trials' (Ray Data's actors')
    cpu_node_type: str | None = None  # the custom resource that pins the actors there

    def bundle(self, cpus: float, gpus: float) -> dict[str, float]:
        """One Ray bundle: the CPUs, the GPU fraction, and a sliver of the node-type label."""
        bundle = {"CPU": cpus}
        if gpus:
            bundle["GPU"] = gpus
        if self.node_type:
            bundle[self.node_type] = NODE_TYPE_SHARE
        return bundle

    def bundles(
        self, job: TrialJob, config: LoaderConfig, gpus: float, own: float | None = None
    ) -> list[dict[str, float]]:
        """A measurement's bundles: its own (the training process's CPUs, its workers',
        or ``own``; the GPU), then a Ray Data candidate's actors', on the CPU nodes when
        they are pinned (``--cpu-node-type``)."""
        head = self.bundle(job.cpus_for(config.num_workers) if own is None else own, gpus)
        return [head, *engine_of(config).bundles(self.cpu_node_type)]


@dataclass(frozen=True)
class TuneSettings:
    """How the Tune run goes: its objective, trials, concurrency, budget, GPUs per trial, seed,
    storage, resume, and the searcher's method and model."""

    objective: str
    num_samples: int
    max_concurrent: int
    time_budget_s: float | None
    gpus_per_trial: float
    seed: int
    storage: str  # a local folder or a URI Tune's storage understands (s3://, gs://, ...)
    name: str
    resume: bool = False
    verbose: bool = False
    method: str = "tpe"  # how the searcher proposes: model, tpe or random (--search)
    model: CostModel | None = None  # the cost model, for method "model"


@dataclass(frozen=True)
class TrialEvent:
    """What the progress display is told about a trial."""

    kind: str  # "result" (interim), "complete", "error"
    trial_id: str
    config: dict[str, Any]
    metrics: dict[str, Any]


EventFn = Callable[[TrialEvent], None]


def start_ray(
    address: str | None,
    dashboard_host: str,
    num_cpus: int,
    verbose: bool,
    node_type: str | None = None,
    cpu_node_type: str | None = None,
) -> RayCluster:
    """Start a local Ray instance (dashboard on ``dashboard_host``) or join ``address``;
    the CPUs beyond the trials' nodes are those of the nodes without ``node_type`` (with
    ``cpu_node_type``, those carrying it)."""
    kwargs: dict[str, Any] = {
        "logging_level": logging.INFO if verbose else logging.WARNING,
        "log_to_driver": verbose,
        "configure_logging": True,
        # A reused trial process waits this long for the previous trial's thread (one
        # ASHA stopped: it shuts its loader's workers down) before the next trial
        # starts; Tune's default of 2 s would fail the next trial instead.
        "runtime_env": {"env_vars": {"TUNE_FUNCTION_THREAD_TIMEOUT_S": str(REUSE_WAIT_S)}},
    }
    if address:
        try:
            context = ray.init(address=address, **kwargs)
        except ConnectionError as exc:
            raise ConfigError(
                f"cannot join the Ray cluster at {address!r} ({exc}); start it with "
                "`ray start --head` or check the address"
            ) from None
    else:
        # "local": start our own instance even when a `ray start` cluster runs here;
        # Ray turns token authentication on, and its warning on how to turn it off is
        # left out (the dashboard's line says where the token is)
        with logs.filtered(logs.AUTH_SETUP_LOGGER, logs.AUTH_ON_WARNING):
            context = ray.init(
                address="local", num_cpus=num_cpus, dashboard_host=dashboard_host,
                _system_config={
                    "idle_worker_killing_time_threshold_ms": IDLE_WORKER_KEEP_MS,
                    "worker_niceness": WORKER_NICENESS,
                    "prestart_worker_first_driver": PRESTART_WORKERS,
                },
                **kwargs,
            )  # fmt: skip
    url = getattr(context, "dashboard_url", None) or None
    if url and not url.startswith("http"):
        url = f"http://{url}"
    alive = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    eligible = [r for r in alive if not node_type or r.get(node_type, 0) > 0]
    if not eligible:
        stop_ray()
        raise ConfigError(
            f"no node of the cluster carries the resource {node_type!r}; start nodes with "
            f"ray start --resources '{{\"{node_type}\": 1}}' or pick another --node-type"
        )
    return RayCluster(
        dashboard_url=url,
        node_cpus=max(r.get("CPU", 0.0) for r in eligible),
        gpus=sum(r.get("GPU", 0.0) for r in eligible),
        max_node_gpus=max(r.get("GPU", 0.0) for r in eligible),
        nodes=len(eligible),
        joined=bool(address),
        node_type=node_type,
        remote_cpus=remote_cpus(alive, node_type, pin=cpu_node_type),
        cpu_node_type=cpu_node_type,
    )


# What Ray Data's actors import where they run: the worker side of every pipeline variant
ACTOR_MODULES = ("torch", "torchvision", "PIL", "numpy", "raytune_loader.pipeline.transforms",
                 "raytune_loader.raydata.actors", "ray.data")  # fmt: skip


def check_cpu_nodes(cluster: RayCluster, timeout_s: float = 120.0) -> None:
    """Each live node Ray Data's actors may run on (beyond the trials' nodes) imports
    what they run: a ConfigError in one line naming the first that cannot, before any
    trial (an actor that cannot start would only fail its trials later)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def first_missing(modules: tuple[str, ...]) -> str | None:  # pickled by value: it runs
        import importlib  # where this package itself may be missing

        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                return f"{name} ({exc})"
        return None

    probe = ray.remote(num_cpus=0)(first_missing)
    kind, pin = cluster.node_type, cluster.cpu_node_type
    alive = [n for n in ray.nodes() if n.get("Alive")]
    nodes = [n for n in alive if is_remote(n["Resources"], kind, pin)]
    for node in nodes:
        where = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        try:
            missing = ray.get(probe.options(scheduling_strategy=where).remote(ACTOR_MODULES),
                              timeout=timeout_s)  # fmt: skip
        except (ray.exceptions.RayError, ImportError) as exc:
            missing = last_line(exc)
        if missing:
            raise ConfigError(
                f"the CPU node {node['NodeManagerAddress']} (node {node['NodeID'][:12]}) cannot "
                f"run Ray Data's actors: {missing}; install raytune_loader and its "
                "dependencies there, or leave it out (--cpu-node-type, --no-ray-data)"
            )


def live_nodes() -> set[str] | None:
    """The ids of the cluster's live nodes; None without a running Ray."""
    if not ray.is_initialized():
        return None
    return {node["NodeID"] for node in ray.nodes() if node.get("Alive")}


def stop_ray() -> None:
    """Shut down the Ray instance this process started or joined (its daemons with it)."""
    if ray.is_initialized():
        ray.shutdown()


class _ProgressCallback(tune.Callback):
    def __init__(self, on_event: EventFn) -> None:
        self._on_event = on_event

    def _emit(self, kind: str, trial: Any, metrics: dict[str, Any] | None) -> None:
        self._on_event(TrialEvent(kind, trial.trial_id, dict(trial.config), dict(metrics or {})))

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        self._emit("result", trial, result)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._emit("complete", trial, trial.last_result)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._emit("error", trial, trial.last_result)


def trainable(job: TrialJob, gpus_per_trial: float, cluster: RayCluster) -> Any:
    """The Tune trainable: :func:`trial_fn` with the job and a bundle per configuration
    (a Ray Data candidate's: a placement group with its actors' bundles, packed)."""

    def resources(config: dict[str, Any]) -> dict[str, float] | tune.PlacementGroupFactory:
        known = {k: v for k, v in config.items() if k in CONFIG_KEYS}
        candidate = LoaderConfig.from_dict(known, batch_size=1)  # its batch reserves nothing
        bundles = cluster.bundles(job, candidate, gpus_per_trial)
        if len(bundles) == 1:  # its workers run in the trial's own bundle
            return bundles[0]
        return tune.PlacementGroupFactory(bundles, strategy="PACK")

    return tune.with_resources(tune.with_parameters(trial_fn, job=job), resources=resources)


def _experiment_path(storage: str, name: str) -> str:
    return f"{storage.rstrip('/')}/{name}"


def can_resume(storage: str, name: str) -> bool:
    """Whether Tune saved the experiment ``name`` under ``storage``."""
    return tune.Tuner.can_restore(_experiment_path(storage, name))


@dataclass(frozen=True)
class AshaSettings:
    """How ASHA stops losers: one rung per report to Tune, halving at each."""

    max_t: int  # reports of a whole segment (interim and final)
    grace_period: int = 1
    reduction_factor: int = 2

    @classmethod
    def for_job(cls, job: TrialJob) -> AshaSettings:
        """ASHA's settings for ``job``: a rung every report, at most as many as the segment
        reports."""
        return cls(max_t=job.segment.reports)

    def scheduler(self) -> ASHAScheduler:
        """Tune's ASHA scheduler with these settings, on ``metric``."""
        return ASHAScheduler(time_attr="training_iteration", **asdict(self))

    def __str__(self) -> str:
        return "ASHA(" + ", ".join(f"{k}={v}" for k, v in asdict(self).items()) + ")"


def scheduler_description(job: TrialJob) -> str:
    """ASHA as ``best_config.json`` records it: the settings :func:`run_tune` uses."""
    return str(AshaSettings.for_job(job))


@dataclass(frozen=True)
class TuneRun:
    """The trials of a Tune run, and whether Ctrl-C ended it."""

    records: list[TrialRecord]
    interrupted: bool
    search: dict[str, Any] = field(default_factory=dict)  # how the searcher proposed


def run_tune(
    job: TrialJob,
    space: SearchSpace,
    settings: TuneSettings,
    cluster: RayCluster,
    on_event: EventFn,
) -> TuneRun:
    """Run (or resume) the Tune search; Ctrl-C ends it early with the state saved."""
    import optuna

    if not settings.verbose:
        # Tune's new console output prints its banner at any verbosity; the legacy one
        # is silent at 0 and our own progress display takes its place.
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    fn = trainable(job, settings.gpus_per_trial, cluster)
    searcher = None  # a resumed search's searcher is Tune's restored copy
    if settings.resume:
        experiment = _experiment_path(settings.storage, settings.name)
        tuner = tune.Tuner.restore(experiment, trainable=fn, resume_errored=False)
        deadline = None
    else:
        deadline = time.time() + settings.time_budget_s if settings.time_budget_s else None
        searcher = LoaderSearcher(
            space, settings.objective, settings.seed, deadline=deadline, cold=job.cold,
            method=settings.method, model=settings.model,
        )  # fmt: skip
        tuner = _new_tuner(fn, job, searcher, settings, on_event)
    with credentials_kept_out_of_ray():
        grid, interrupted = _fit(tuner, resumed=settings.resume)
    records = [_record(result, space) for result in grid]
    records.sort(key=lambda record: record.finished_at or 0)
    summary = searcher.summary() if searcher is not None else {"method": settings.method}
    return TuneRun(records, interrupted or _short(records, settings, deadline), summary)


def _new_tuner(
    fn: Any,
    job: TrialJob,
    searcher: LoaderSearcher,
    settings: TuneSettings,
    on_event: EventFn,
) -> tune.Tuner:
    scheduler = AshaSettings.for_job(job).scheduler()
    return tune.Tuner(
        fn,
        tune_config=tune.TuneConfig(
            metric=settings.objective,
            mode="max",
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=settings.num_samples,
            max_concurrent_trials=settings.max_concurrent,
            # a trial with the same bundle runs in the last one's process: no new
            # interpreter, imports or dataset listing (measure.py keeps nothing else)
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=settings.name,
            storage_path=settings.storage,
            verbose=2 if settings.verbose else 0,
            callbacks=[_ProgressCallback(on_event)],
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )


class _InterruptMarker:
    """The SIGINT handler in place while Tune runs: Tune keeps it as the one to restore.

    Tune's own handler (installed by ``fit``) ends the run gracefully on the first
    Ctrl-C, saving its state, then puts this one back; so after ``fit`` this marker
    being installed again means Ctrl-C arrived, whichever trial was running. A second
    Ctrl-C reaches this marker and interrupts at once.
    """

    def __call__(self, signum: int, frame: Any) -> None:
        raise KeyboardInterrupt


def _fit(tuner: tune.Tuner, resumed: bool = False) -> tuple[tune.ResultGrid, bool]:
    """``tuner.fit()`` and whether Ctrl-C ended it; afterwards Ctrl-C interrupts again.
    ``resumed``: the run continues a stopped one, whose cut-short trial has no results
    either (the analysis's warning is left out from the start).

    Tune leaves its handler installed after a normal end, which made a Ctrl-C during
    verification only print Tune's warning: the handlers from before are restored.
    """
    if threading.current_thread() is not threading.main_thread():
        return tuner.fit(), False  # Tune installs no handler outside the main thread
    caught = [signal.SIGINT, *([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])]
    previous = {sig: signal.getsignal(sig) for sig in caught}
    marker = _InterruptMarker()
    signal.signal(signal.SIGINT, marker)
    # Through Ray Client (ray://) the Tune loop runs remotely and installs no handler
    # here: the trials' statuses alone then tell an interrupted run.
    tune_handles_sigint = (
        os.environ.get("TUNE_DISABLE_SIGINT_HANDLER", "0") == "0"
        and not ray.util.client.ray.is_connected()
    )
    try:
        with (
            logs.filtered(logs.TUNE_RUN_LOGGER, logs.RESTORE_HINT),
            logs.filtered(logs.TUNE_RUN_LOGGER, logs.STOP_NOTICE, instead=logs.STOP_SAID) as stop,
            logs.filtered(logs.ANALYSIS_LOGGER, logs.NO_METRICS, after=None if resumed else stop),
        ):
            grid = tuner.fit()
        return grid, tune_handles_sigint and signal.getsignal(signal.SIGINT) is marker
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: installed outside Python, cannot be restored
                signal.signal(sig, handler)


def _short(records: list[TrialRecord], settings: TuneSettings, deadline: float | None) -> bool:
    """Unfinished trials, or fewer trials than asked without a budget that ran out."""
    if any(record.status == "interrupted" for record in records):
        return True
    budget_spent = deadline is not None and time.time() > deadline
    # a resumed search does not know its original deadline: only a search without a
    # budget is unfinished merely for having fewer trials than asked
    return len(records) < settings.num_samples and not budget_spent and not settings.time_budget_s


def _record(result: Any, space: SearchSpace) -> TrialRecord:
    error = last_line(result.error) if result.error is not None else None
    fallback_id = "_".join(Path(result.path).name.split("_")[2:4])
    return record_from_report(
        fallback_id, dict(result.config or {}), dict(result.metrics or {}), error,
        space.constants(), space.baselines(),
    )  # fmt: skip


def _task_options(bundle: dict[str, float], node_id: str | None) -> dict[str, Any]:
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


@dataclass(frozen=True)
class RayMeasurer(Measurer):
    """Measurements as Ray tasks, each with its own bundle: the ceiling and verification
    runs of a search (a :class:`~raytune_loader.measuring.measurer.Measurer`). On a node
    with several GPUs each measurement with a GPU runs in a worker process of its own: a
    reused one's CUDA stays on the GPU of the first task it ran
    (:class:`~raytune_loader.tuning.trainable.Task`)."""

    cluster: RayCluster
    gpus: float  # the GPU (fraction) each task reserves
    node_id: str | None = None

    def _remote(
        self, task: Task, job: TrialJob, cpus: float, placed: dict[str, Any] | None = None
    ) -> Any:
        """``task``'s remote function with the bundle of ``cpus`` and the GPUs (or the
        ``placed`` options of a placement group's first bundle); in a worker of its own
        where CUDA will start on a node of several GPUs."""
        cuda = self.gpus if job.device.startswith("cuda") else 0.0
        remote = task.on(cuda, self.cluster.max_node_gpus)
        options = placed or _task_options(self.cluster.bundle(cpus, self.gpus), self.node_id)
        return remote.options(**options)

    @contextlib.contextmanager
    def _placed(
        self, job: TrialJob, config: LoaderConfig | None, own: float | None = None
    ) -> Iterator[dict[str, Any] | None]:
        """For a Ray Data candidate, the options that run a measurement (of ``own`` CPUs,
        by default the candidate's) in the first bundle of a placement group of its own,
        with its actors' bundles (as a trial's); the group is removed when the block
        ends, and its actors with it. None for a DataLoader, or no candidate."""
        bundles = [] if config is None else self.cluster.bundles(job, config, self.gpus, own)
        if len(bundles) < 2:  # nothing beside the measurement's own bundle
            yield None
            return
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = placement_group(bundles, strategy="PACK")
        try:
            limit = job.segment.give_up_s
            if not group.wait(timeout_seconds=limit):
                raise DataPipelineError(
                    "resources",
                    f"{config.label()}: the cluster gave its actors' {config.actor_cpus:g} "
                    f"CPUs no room within {limit:.0f}s; free them or lower --remote-cpus",
                )
            head = bundles[0]
            strategy = PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
            )
            try:
                yield {**_task_options(head, None), "scheduling_strategy": strategy}
            except DataPipelineError as exc:
                if ray.util.placement_group_table(group).get("state") != "RESCHEDULING":
                    raise
                raise DataPipelineError(  # its actors cannot come back: say why it stalled
                    exc.reason, f"{exc}: a node holding its actors' bundles left the cluster"
                ) from None
        finally:
            remove_placement_group(group)

    def measure(self, job: TrialJob, config: LoaderConfig, slot: int = 0) -> TrialOutcome:
        cpus = job.cpus_reserved(config)
        try:
            with self._placed(job, config) as placed:
                own = job.cpus_for(config.num_workers)
                ref = self._remote(MEASURE, job, own, placed).remote(job, config, slot)
                return self._result(ref, job, "the measurement")
        except DataPipelineError as exc:  # past its time, a module missing, a GPU not its own
            return TrialOutcome(config, cpus, 0, failure=exc.reason, detail=str(exc))
        except (ray.exceptions.RayError, RaytuneLoaderError) as exc:  # it raised, or died
            return TrialOutcome(config, cpus, 0, failure="error", detail=last_line(exc))

    def ceiling(
        self, job: TrialJob, batch_size: int, windows: int = CEILING_WINDOWS
    ) -> tuple[int, float]:
        cpus = job.cpus_for(0)  # a CPU a rank
        ref = self._remote(CEILING, job, cpus).remote(job, batch_size, windows)
        return self._result(ref, job, "the ceiling")

    def profile(self, job: TrialJob, structures: list[LoaderConfig], cores: int) -> Profile:
        """The profile in a task of its own bundle; beside an actor's on another node,
        where the space offers Ray Data and the cluster has CPUs beyond the trials'
        nodes (the profile times receiving from it)."""
        cpus = job.cpus_for(1)  # the training process and one worker
        remote = [c for c in structures if engine_of(c).remote]
        probe = receiver(remote[0]) if remote and self.cluster.remote_cpus else None
        with self._placed(job, probe, own=cpus) as placed:
            ref = self._remote(PROFILE, job, cpus, placed).remote(job, structures, cores)
            return self._result(ref, job, "the profile")  # type: ignore[no-any-return]

    def input_rate(self, job: TrialJob, config: LoaderConfig) -> InputRate:
        with self._placed(job, config) as placed:
            own = job.cpus_for(config.num_workers)
            ref = self._remote(INPUT, job, own, placed).remote(job, config)
            return self._result(ref, job, "the input pipeline")

    def _result(self, ref: Any, job: TrialJob, what: str) -> Any:
        limit = job.segment.give_up_s
        try:
            return ray.get(ref, timeout=limit)
        except ray.exceptions.GetTimeoutError:  # a sample that never returns
            ray.cancel(ref, force=True)
            raise DataPipelineError(
                "timeout", f"{what} gave no result after {limit:.0f}s (--trial-timeout)"
            ) from None
        except ray.exceptions.RayTaskError as exc:
            raise exc.cause from None  # the task's own exception, with its one-line message
