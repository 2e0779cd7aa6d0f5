"""Ray on the driver side: start or join Ray, run the Tune search, run measurements.

Every driver-side Ray and Tune call lives here (the trial side is
:mod:`raytune_loader.trainable`), so a change in Ray's API touches two modules.
The search is an :class:`~ray.tune.search.optuna.OptunaSearch` over the
define-by-run space with a seeded TPE sampler and the two baselines enqueued
first, ASHA on the reporting interval, and one Ray bundle per trial of
``min(1 + cpus_per_worker x num_workers, node CPUs)`` CPUs plus the fractional GPU.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from raytune_loader.errors import ConfigError
from raytune_loader.measure import DATA_SLOT, TrialJob, last_line
from raytune_loader.space import LoaderConfig, SearchSpace, reserved_cpus
from raytune_loader.trainable import trial_fn

log = logging.getLogger(__name__)


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

    def bundle(self, cpus: float, gpus: float) -> dict[str, float]:
        """One Ray bundle: the CPUs, the GPU fraction, and a sliver of the node-type label."""
        bundle = {"CPU": cpus}
        if gpus:
            bundle["GPU"] = gpus
        if self.node_type:
            bundle[self.node_type] = NODE_TYPE_SHARE
        return bundle


NODE_TYPE_SHARE = 0.001  # requesting a custom resource pins a bundle to nodes that carry it


@dataclass(frozen=True)
class TuneSettings:
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
) -> RayCluster:
    """Start a local Ray instance (dashboard on ``dashboard_host``) or join ``address``."""
    kwargs: dict[str, Any] = {
        "logging_level": logging.INFO if verbose else logging.WARNING,
        "log_to_driver": verbose,
        "configure_logging": True,
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
        # "local": start our own instance even when a `ray start` cluster runs here
        context = ray.init(
            address="local", num_cpus=num_cpus, dashboard_host=dashboard_host, **kwargs
        )
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
    )


def node_resources() -> dict[str, dict[str, float]]:
    """Ray's resources of every alive node, by node id."""
    return {n["NodeID"]: n["Resources"] for n in ray.nodes() if n.get("Alive")}


def stop_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()


class _LoaderSearch(OptunaSearch):
    """OptunaSearch that stops at the time budget and does not measure a config twice.

    Tune's own ``time_budget_s`` kills running trials; the contract is only to stop
    starting new ones. The space is small on small machines (17 configurations on
    two cores), so TPE often proposes a configuration already measured: its known
    result is told to Optuna and another is asked for, up to ``max_retries`` times.
    """

    def __init__(
        self,
        *args: Any,
        deadline: float | None = None,
        max_retries: int = 20,
        cold: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._cold = cold
        self._slots = 0
        self._deadline = deadline
        self._max_retries = max_retries
        self._measured: dict[tuple[tuple[str, Any], ...], float] = {}
        self._running: dict[str, tuple[tuple[str, Any], ...]] = {}

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._deadline is not None and time.time() > self._deadline:
            return Searcher.FINISHED
        config = super().suggest(trial_id)
        for _ in range(self._max_retries):
            key = tuple(sorted((config or {}).items()))
            if key not in self._measured:
                break
            # OptunaSearch keeps its asked trials in _ot_trials; tell Optuna the known
            # value so TPE learns from it, then ask again for the same Tune trial.
            self._ot_study.tell(self._ot_trials.pop(trial_id), self._measured[key])
            config = super().suggest(trial_id)
        self._running[trial_id] = tuple(sorted((config or {}).items()))
        if self._cold and isinstance(config, dict):
            config = {**config, DATA_SLOT: self._slots}  # a subset no earlier trial read
            self._slots += 1
        return config

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        key = self._running.pop(trial_id, None)
        if key is not None and result and self.metric in result:
            self._measured[key] = float(result[self.metric])
        super().on_trial_complete(trial_id, result, error)


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


def _trainable(job: TrialJob, gpus_per_trial: float, cluster: RayCluster) -> Any:
    def resources(config: dict[str, Any]) -> dict[str, float]:
        workers = config.get("num_workers", 0)
        cpus = reserved_cpus(workers, job.cpus_per_worker, cluster.node_cpus)
        return cluster.bundle(cpus, gpus_per_trial)

    return tune.with_resources(tune.with_parameters(trial_fn, job=job), resources=resources)


def run_search(
    job: TrialJob,
    space: SearchSpace,
    settings: TuneSettings,
    cluster: RayCluster,
    on_event: EventFn,
) -> SearchOutcome:
    """Run (or resume) the Tune search; Ctrl-C ends it early with the state saved."""
    import optuna

    if not settings.verbose:
        # Tune's new console output prints its banner at any verbosity; the legacy one
        # is silent at 0 and our own progress display takes its place.
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    trainable = _trainable(job, settings.gpus_per_trial, cluster)
    experiment = f"{settings.storage.rstrip('/')}/{settings.name}"
    if settings.resume:
        if not tune.Tuner.can_restore(experiment):
            raise ConfigError(f"no search to resume in {experiment}; run without --resume")
        restored = tune.Tuner.restore(experiment, trainable=trainable, resume_errored=False)
        return _outcome(_fit(restored), settings, deadline=None)
    deadline = time.time() + settings.time_budget_s if settings.time_budget_s else None

    searcher = _LoaderSearch(
        space=space.define_by_run,
        metric=settings.objective,
        mode="max",
        sampler=optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=4),
        points_to_evaluate=[space.as_point(cfg) for cfg in space.baselines().values()],
        deadline=deadline,
        cold=job.cold,
    )
    scheduler = ASHAScheduler(
        time_attr="training_iteration",
        max_t=job.segment.reports,
        grace_period=1,
        reduction_factor=2,
    )
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            metric=settings.objective,
            mode="max",
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=settings.num_samples,
            max_concurrent_trials=settings.max_concurrent,
        ),
        run_config=tune.RunConfig(
            name=settings.name,
            storage_path=settings.storage,
            verbose=2 if settings.verbose else 0,
            callbacks=[_ProgressCallback(on_event)],
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
    return _outcome(_fit(tuner), settings, deadline)


def _fit(tuner: tune.Tuner) -> tune.ResultGrid:
    """``tuner.fit()``, then Ctrl-C means KeyboardInterrupt again.

    Tune installs its own SIGINT handler (first Ctrl-C: end the run gracefully) and
    leaves it installed after a normal end, so a Ctrl-C during verification only
    printed Tune's warning.
    """
    if threading.current_thread() is not threading.main_thread():
        return tuner.fit()  # Tune installs no handler outside the main thread
    caught = [signal.SIGINT, *([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])]
    previous = {sig: signal.getsignal(sig) for sig in caught}
    try:
        return tuner.fit()
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: installed outside Python, cannot be restored
                signal.signal(sig, handler)


@dataclass(frozen=True)
class SearchOutcome:
    grid: tune.ResultGrid
    interrupted: bool


def _outcome(
    grid: tune.ResultGrid, settings: TuneSettings, deadline: float | None
) -> SearchOutcome:
    """Tune returns normally after Ctrl-C; unfinished trials tell that it was interrupted."""
    unfinished = len(grid) - grid.num_terminated - grid.num_errors
    budget_spent = deadline is not None and time.time() > deadline
    # a resumed search does not know its original deadline: only a search without a
    # budget is unfinished merely for having fewer trials than asked
    short = len(grid) < settings.num_samples and not budget_spent and not settings.time_budget_s
    return SearchOutcome(grid, interrupted=unfinished > 0 or short)


def space_constants(space: SearchSpace) -> dict[str, Any]:
    """Values the space fixes rather than searches (a single batch size)."""
    return {"batch_size": space.batch_sizes[0]} if len(space.batch_sizes) == 1 else {}


TRIAL_COLUMNS = [
    "trial_id", "status", "reason", "baseline",
    "num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "batch_size",
    "effective_batch_size", "oom_backoffs", "cpus_reserved", "host_bytes_in_flight",
    "samples_per_s", "data_wait_frac", "util", "util_source", "device_util",
    "ceiling_samples_per_s", "efficiency", "training_iteration", "time_total_s",
    "finished_at", "node_id", "hostname", "hardware_class", "cpu_model", "node_cpus",
    "gpu_name", "node_gpus", "ram_bytes", "cuda_visible_devices",
]  # fmt: skip


def trial_rows(grid: tune.ResultGrid, space: SearchSpace) -> list[dict[str, Any]]:
    """One plain row per trial: config, last metrics, status and failure reason."""
    rows = []
    for result in grid:
        metrics = dict(result.metrics or {})
        try:
            config: LoaderConfig | None = LoaderConfig.from_trial_config(
                {**space_constants(space), **result.config}
            )
        except (ConfigError, TypeError):  # a trial interrupted before Tune saved its config
            config = None
        if result.error is not None:
            status, reason = "error", last_line(result.error)[:300]
        elif metrics.get("failure"):
            status, reason = "failed", f"{metrics['failure']}: {metrics.get('detail', '')}"
        elif metrics.get("final"):
            status, reason = "ok", ""
        elif metrics.get("done"):  # Tune marks a trial done when ASHA stops it
            status, reason = "stopped_early", "ASHA"
        else:
            status, reason = "interrupted", "the search was interrupted; --resume re-runs it"
        row = {column: metrics.get(column) for column in TRIAL_COLUMNS}
        row.update(config.kwargs() if config else {})
        row.update(
            trial_id=metrics.get("trial_id") or "_".join(Path(result.path).name.split("_")[2:4]),
            status=status,
            reason=reason,
            baseline=(space.baseline_name(config) if config else None) or "",
            finished_at=metrics.get("timestamp"),
        )
        rows.append(row)
    return sorted(rows, key=lambda row: row["finished_at"] or 0)
