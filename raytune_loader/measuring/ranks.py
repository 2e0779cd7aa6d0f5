"""Several data-parallel ranks in one measurement: a node's training, all ranks at once.

With ``--ranks-per-node N`` every measurement (trial, ceiling, verification, the
input pipeline alone) starts N rank processes on the node it runs on. Each rank
has the candidate loader, built as users' training builds it (in the process
group it reads its own shard of the trial's samples), trains its
own replica of the model wrapped in ``DistributedDataParallel`` (gradients
all-reduced: NCCL when every rank has a GPU of its own, gloo on a CPU or when
ranks share a GPU) and reports its own figures. The node's rate is N x the
slowest rank's, the pace of synchronous training.

The ranks are processes of the measurement's own process (a forkserver, with this
module preloaded; each rank is given the measurement's ``CUDA_VISIBLE_DEVICES``, not
the one the forkserver started with), not Ray Train workers: a ``TorchTrainer``
inside each Tune trial cost 19-26 s a trial on this project's 2-core machine against
1.5 s for a reused forkserver (results/benchmarks/ranks_overhead.md). The trial's one
Ray bundle holds all ranks' CPUs and GPUs, so they share one node.
"""

from __future__ import annotations

import datetime as dt
import logging
import multiprocessing
import os
import queue as queue_module
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import psutil
import torch

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.engines import engine_of
from raytune_loader.errors import BatchSizeTooSmallError, DataPipelineError, last_line
from raytune_loader.loaders.loader import use_platform_start_method
from raytune_loader.measuring import measure
from raytune_loader.measuring.backoff import BackoffOutcome, run_with_backoff
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.outcomes import InputRate, RankStat, TrialOutcome, merge_ranks

log = logging.getLogger(__name__)
ReportFn = Callable[[dict[str, Any]], None]
Task = Callable[..., Any]


@dataclass(frozen=True)
class RankRun:
    """What one rank measured, and where and when it ran."""

    rank: int
    value: Any  # the task's result: a TrialOutcome, a (batch size, samples/s), an InputRate
    pid: int
    host: str
    started: float  # wall clock (time.time) of the rank's start and end
    ended: float


class RankError(Exception):
    """A rank raised, died, or the ranks ran out of time."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class GroupNotFormedError(RankError):
    """The ranks' process group did not form (before any step ran)."""


# a group that did not form is formed again, in a new meeting folder: nothing ran in it
# (gloo's connectFullMesh, "Connection closed by peer": under a loaded fast tier, in 1
# fresh clone's run in 3, and in 1 group formed right after another had failed)
GROUP_TRIES = 3


def run_trial(
    job: TrialJob, config: LoaderConfig, report: ReportFn | None = None, slot: int = 0
) -> TrialOutcome:
    """:func:`raytune_loader.measuring.measure.run_trial` on every rank at once; one rank runs it in
    this process."""
    if job.ranks == 1:
        return measure.run_trial(job, config, report, slot)
    cpus = job.cpus_reserved(config)
    if engine_of(config).remote:  # the ranks are not Ray workers: no cluster to run it on
        return TrialOutcome(config, cpus, 0, failure="raydata_ranks", detail=(
            f"{config.label()}: a Ray Data candidate is measured with one rank per trial; "
            "drop --ranks-per-node or --ray-data"))  # fmt: skip

    def forward(metrics: dict[str, Any]) -> None:  # rank 0's interim reports, for ASHA
        if report is not None:
            size = metrics.get("effective_batch_size") or config.batch_size
            report({
                **metrics, "samples_per_s": metrics["samples_per_s"] * job.ranks,
                "oom_backoffs": (config.batch_size // size).bit_length() - 1,
            })  # fmt: skip

    def at_size(batch_size: int) -> list[RankRun]:
        return _run_ranks(job, _trial_in_rank, (config.with_batch_size(batch_size), slot), forward)

    try:
        outcome = _backing_off(job, at_size, config.batch_size)
    except BatchSizeTooSmallError as exc:
        return TrialOutcome(config, cpus, 0, failure="oom", detail=str(exc))
    except RankError as exc:
        return TrialOutcome(config, cpus, 0, failure=exc.reason, detail=str(exc))
    return node_outcome(job, config, outcome.value, outcome.backoffs)


def measure_ceiling(
    job: TrialJob, batch_size: int, windows: int = measure.CEILING_WINDOWS
) -> tuple[int, float]:
    """The ceiling of N ranks on resident batches: N x the slowest rank's."""
    if job.ranks == 1:
        return measure.measure_ceiling(job, batch_size, windows)

    def at_size(size: int) -> list[RankRun]:
        return _measured(job, _ceiling_in_rank, (size, windows), "the ceiling")

    outcome = _backing_off(job, at_size, batch_size)
    speeds = [run.value[1] for run in outcome.value]
    return outcome.effective_batch_size, job.ranks * min(speeds)


def _backing_off(
    job: TrialJob, at_size: Callable[[int], list[RankRun]], batch_size: int
) -> BackoffOutcome[list[RankRun]]:
    """All ranks at one batch size; when one runs out of memory, all stop and all start
    again at half the size. A rank that backed off alone would leave its peers waiting
    in a collective its smaller steps no longer match."""

    def attempt(size: int) -> list[RankRun]:
        try:
            return at_size(size)
        except (RankError, DataPipelineError) as exc:
            if exc.reason == "oom":
                raise torch.cuda.OutOfMemoryError(str(exc)) from None
            raise

    return run_with_backoff(attempt, batch_size, job.min_batch_size, release=lambda: None)


def measure_input(job: TrialJob, config: LoaderConfig, slot: int = 0) -> InputRate:
    """Every rank's input pipeline alone at once: N x the slowest rank's rate."""
    if job.ranks == 1:
        return measure.measure_input(job, config, slot)
    runs = _measured(job, _input_in_rank, (config, slot), "the input pipeline")
    rates = [run.value for run in runs]
    return InputRate(job.ranks * min(r.samples_per_s for r in rates), rates[0].per_core)


def _measured(job: TrialJob, task: Task, args: tuple[Any, ...], what: str) -> list[RankRun]:
    try:
        return _run_ranks(job, task, args, None)
    except RankError as exc:
        raise DataPipelineError(exc.reason, f"{what}: {exc}") from None


def node_outcome(
    job: TrialJob, config: LoaderConfig, runs: list[RankRun], oom_backoffs: int = 0
) -> TrialOutcome:
    """The node's outcome from its ranks' (which ran at one batch size, after
    ``oom_backoffs`` halvings of ``config``'s): a rank's failure is the trial's; else
    each figure merged as :class:`~raytune_loader.measuring.outcomes.SegmentMetrics` declares it
    (the rate N x the slowest rank's, the data wait the worst rank's, memory together)."""
    outcomes: list[TrialOutcome] = [run.value for run in runs]
    failed = next((o for o in outcomes if o.failure), None)
    first = outcomes[0]
    if failed is not None:
        rank = outcomes.index(failed)
        return replace(
            failed, config=config, detail=f"rank {rank}: {failed.detail}", ranks=_stats(runs)
        )
    metrics = [o.metrics for o in outcomes if o.metrics is not None]
    effective = min(o.effective_batch_size or 0 for o in outcomes)
    node = merge_ranks(metrics)
    return replace(
        first,
        config=config,
        metrics=node,
        effective_batch_size=effective or None,
        oom_backoffs=oom_backoffs,
        host_bytes_in_flight=sum(o.host_bytes_in_flight for o in outcomes),
        ceiling_samples_per_s=job.ceilings.get(effective),
        ranks=_stats(runs),
    )


def _stats(runs: list[RankRun]) -> tuple[RankStat, ...]:
    return tuple(
        RankStat(
            rank=run.rank,
            samples_per_s=run.value.metrics.samples_per_s if run.value.metrics else 0.0,
            data_wait_frac=run.value.metrics.data_wait_frac if run.value.metrics else 1.0,
            host=run.host,
            pid=run.pid,
            started=run.started,
            ended=run.ended,
        )
        for run in runs
    )


def rank_job(job: TrialJob, batch_size: int) -> TrialJob:
    """The job as one rank measures it at ``batch_size``: its share of the node's ceiling
    (so a rank's CPU ``util`` is a share of its own ceiling), and no out-of-memory
    back-off of its own (the node's ranks back off together, :func:`_backing_off`)."""
    ceilings = {bs: c / job.ranks for bs, c in job.ceilings.items()}
    return replace(job, ceilings=ceilings, min_batch_size=batch_size)


def _trial_in_rank(job: TrialJob, config: LoaderConfig, slot: int, report: ReportFn) -> Any:
    return measure.run_trial(rank_job(job, config.batch_size), config, report, slot)


def _ceiling_in_rank(job: TrialJob, batch_size: int, windows: int, report: ReportFn) -> Any:
    return measure.measure_ceiling(rank_job(job, batch_size), batch_size, windows)


def _input_in_rank(job: TrialJob, config: LoaderConfig, slot: int, report: ReportFn) -> Any:
    return measure.measure_input(job, config, slot)


def _run_ranks(
    job: TrialJob, task: Task, args: tuple[Any, ...], forward: ReportFn | None
) -> list[RankRun]:
    """Start the ranks, pass rank 0's interim reports on, and collect every rank's run;
    RankError when one raises or dies, or past the time limit; a group that did not
    form is formed again (:data:`GROUP_TRIES`). No rank outlives this."""
    for attempt in range(1, GROUP_TRIES + 1):
        try:
            return _run_ranks_once(job, task, args, forward)
        except GroupNotFormedError as exc:
            if attempt == GROUP_TRIES:
                raise
            log.warning("the ranks' process group did not form (%s): forming it again", exc)
    raise AssertionError("unreachable")


def _run_ranks_once(
    job: TrialJob, task: Task, args: tuple[Any, ...], forward: ReportFn | None
) -> list[RankRun]:
    context = multiprocessing.get_context("forkserver")
    # torch, this package and DDP's lazy imports (torch._dynamo: about 2 s) once per
    # measurement process, not once per rank
    context.set_forkserver_preload([__name__, "torch.nn.parallel", "torch._dynamo"])
    results: Any = context.Queue()
    # the ranks meet in a file of a folder of this measurement's own: a free port chosen
    # here could be taken by another process before rank 0 bound it (seen with tests
    # side by side: "Gloo connectFullMesh failed ... Connection closed by peer")
    meeting = tempfile.mkdtemp(prefix="raytune-ranks-")
    rendezvous = f"file://{os.path.join(meeting, 'store')}"
    # the GPUs Ray gave this measurement: the forkserver's children would otherwise have
    # the environment of the measurement that started it (a Ray worker runs many)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    processes = [
        context.Process(
            target=_rank_main,
            args=(rank, job.ranks, rendezvous, job, task, args, results, os.getpid(), visible),
            name=f"raytune-rank-{rank}",
        )
        for rank in range(job.ranks)
    ]
    for process in processes:
        process.start()
    runs: dict[int, RankRun] = {}
    completed = False
    deadline = time.monotonic() + job.segment.give_up_s
    try:
        while len(runs) < job.ranks:
            try:
                kind, rank, payload = results.get(timeout=0.5)
            except queue_module.Empty:
                _check_alive(processes, runs, deadline, job)
                continue
            if kind == "interim" and forward is not None:
                forward(payload)
            elif kind == "unformed":  # its peers wait for it to join the group
                raise GroupNotFormedError("error", f"rank {rank}: {payload}")
            elif kind == "oom":  # its peers wait in a collective it will not join
                raise RankError("oom", f"rank {rank}: {payload}")
            elif kind == "error":  # a peer's death or failure shows as a broken collective
                _raise_if_died(processes, runs, wait_s=2.0)
                _raise_if_failed(results)
                raise RankError("error", f"rank {rank}: {payload}")
            elif kind == "done":
                runs[rank] = payload
                _raise_if_run_failed(payload)  # its peers would wait in a collective
        completed = True
    finally:
        _stop(processes, at_once=not completed)
        shutil.rmtree(meeting, ignore_errors=True)
        results.close()
    return [runs[rank] for rank in range(job.ranks)]


def _raise_if_run_failed(run: RankRun) -> None:
    """RankError with a rank's own failure (a corrupt file in its shard, out of memory):
    the reason the trial records, not the broken collective its peers then see."""
    failure = getattr(run.value, "failure", None)
    if failure:
        raise RankError(failure, f"rank {run.rank}: {run.value.detail}")


def _raise_if_failed(results: Any, wait_s: float = 1.0) -> None:
    """A failed result another rank sent just before a peer's collective broke."""
    until = time.monotonic() + wait_s
    while time.monotonic() < until:
        try:
            kind, _, payload = results.get(timeout=0.1)
        except queue_module.Empty:
            continue
        if kind == "done":
            _raise_if_run_failed(payload)


def _raise_if_died(processes: list[Any], runs: dict[int, RankRun], wait_s: float = 0.0) -> None:
    """RankError naming a rank that ended without its result (killed, or crashed)."""
    until = time.monotonic() + wait_s
    while True:
        for rank, process in enumerate(processes):
            if rank not in runs and process.exitcode not in (None, 0):
                raise RankError(
                    "rank_died",
                    f"rank {rank} died (exit code {process.exitcode}) before its result",
                )
        if time.monotonic() >= until:
            return
        time.sleep(0.1)


def _check_alive(
    processes: list[Any], runs: dict[int, RankRun], deadline: float, job: TrialJob
) -> None:
    _raise_if_died(processes, runs)
    if time.monotonic() > deadline:
        raise RankError(
            "timeout",
            f"the ranks took longer than {job.segment.give_up_s:.0f}s "
            "(--trial-timeout and a grace period for starting them)",
        )


def _stop(processes: list[Any], at_once: bool = False) -> None:
    """Join the ranks; kill those still running (stuck in a collective), at once when the
    measurement ends early (a failure, ASHA stopping the trial)."""
    for process in processes:
        process.join(timeout=0.1 if at_once else 5)
    for process in processes:
        if process.is_alive():  # stuck in a collective its peer never joined
            process.kill()
            process.join()


def _rank_main(
    rank: int,
    world: int,
    rendezvous: str,
    job: TrialJob,
    task: Task,
    args: tuple[Any, ...],
    results: Any,
    parent: int,
    visible: str | None,
) -> None:
    """One rank: join the process group, run the task, send what it measured; on the
    GPUs its measurement was given (``visible``: their ``CUDA_VISIBLE_DEVICES``)."""
    import torch.distributed as dist

    _see_only(visible)  # before CUDA starts here: it reads the variable once
    use_platform_start_method()  # a forkserver's child, its loaders as torchrun's rank's
    _exit_with(parent)
    started = time.time()
    try:
        cuda = job.device.startswith("cuda")
        own_gpus = cuda and torch.cuda.device_count() >= world
        if cuda:
            torch.cuda.set_device(rank % torch.cuda.device_count())
        try:
            dist.init_process_group(
                "nccl" if own_gpus else "gloo",
                init_method=rendezvous,
                rank=rank,
                world_size=world,
                timeout=dt.timedelta(seconds=job.segment.give_up_s),
            )
        except (RuntimeError, ValueError) as exc:  # a peer's connection, the meeting's file
            results.put(("unformed", rank, last_line(exc)))
            return

        def report(metrics: dict[str, Any]) -> None:
            if rank == 0:
                results.put(("interim", rank, metrics))

        value = task(job, *args, report)
        run = RankRun(rank, value, os.getpid(), socket.gethostname(), started, time.time())
        results.put(("done", rank, run))
    except BatchSizeTooSmallError as exc:
        results.put(("oom", rank, last_line(exc)))
    except Exception as exc:  # noqa: BLE001 - whatever a rank raised, the trial says it
        results.put(("error", rank, last_line(exc)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _see_only(visible: str | None) -> None:
    if visible is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible


def _exit_with(parent: int) -> None:
    """A rank ends when the measurement's process does (Ray ends a stopped trial's
    process at once; its ranks, not Ray's, would otherwise go on)."""

    def watch() -> None:
        while psutil.pid_exists(parent):
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="raytune-rank-parent", daemon=True).start()
