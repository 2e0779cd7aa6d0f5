"""The training segment a measurement times: warm-up, drain, then the steady window.

:func:`train_segment` trains warm-up steps on its first batch (not measured), then as
many more batches as the candidate holds (:func:`warmup_batches`: the drain, so the
window reads none of the stock its workers built meanwhile), then the measured steps.
The loop times how long it is blocked waiting for the next batch apart from the rest of
the step, which gives ``data_wait_frac`` and the median and 99th percentile of a step's
wait; ``util`` comes from NVML per-process samples on a GPU and from the same step
timing on a CPU; the rate is the window's steady one
(:mod:`raytune_loader.measuring.steady`). A :class:`~raytune_loader.machine.watch.Watcher`
reads the processes' memory and threads meanwhile, the engine's own watch what its
makers did, and after the window one more batch times the start of the next epoch. A
configuration far below the ceiling ends its drain and its window early
(:func:`steady.drained`, :func:`steady.over_budget`); its epoch then did not end, and
no epoch start is timed.
The batches come from the candidate's engine (:func:`segment_batches`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, Subset

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.engines import Engine, engine_of
from raytune_loader.errors import (
    CorruptSampleError,
    DataPipelineError,
    last_line,
)
from raytune_loader.loaders.batches import Stamped
from raytune_loader.loaders.sharding import process_group
from raytune_loader.machine import hardware, nvml, watch
from raytune_loader.measuring import memoryfit, steady
from raytune_loader.measuring.job import SegmentSpec
from raytune_loader.measuring.memory import sample_nbytes
from raytune_loader.measuring.outcomes import SegmentMetrics
from raytune_loader.measuring.step import Trainer, batch_samples
from raytune_loader.stores.store import StoreWatch, count_requests

log = logging.getLogger(__name__)


ReportFn = Callable[[dict[str, Any]], None]


@contextlib.contextmanager
def pipeline_failures(*, any_error: bool = True) -> Iterator[None]:
    """Failures of the input pipeline as the reasons a trial records: a file that does
    not decode is ``corrupt_sample``; with ``any_error``, whatever else the user's data
    raised is ``data_loader``. Out-of-memory errors and the trial's own failures pass."""
    try:
        yield
    except CorruptSampleError as exc:
        raise DataPipelineError("corrupt_sample", last_line(exc)) from exc
    except (DataPipelineError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - any error of the user's data ends the trial
        if not any_error:
            raise
        raise DataPipelineError("data_loader", last_line(exc)) from exc


_END = object()


class _Epochs:
    """Endless batches, epoch after epoch, failures as the trial's reasons; it counts the
    epochs started and knows the current one's worker processes."""

    def __init__(self, loader: Any, engine: Engine) -> None:
        self.loader = loader
        self.engine = engine  # who makes the batches: what they hold, who makes them
        self.iterator: Any = None
        self.started = 0
        self._produced = False

    def __iter__(self) -> _Epochs:
        return self

    def __next__(self) -> Any:
        while True:
            if self.iterator is None:
                self.iterator = iter(self.loader)
                self.started += 1
                self._produced = False
            with pipeline_failures():
                batch = next(self.iterator, _END)
            if batch is not _END:
                self._produced = True
                return batch
            self.iterator = None  # without persistent workers, the epoch's workers end
            if not self._produced:
                raise DataPipelineError(
                    "data_loader", "the loader produced no batch: fewer samples than one batch"
                )

    def worker_pids(self) -> list[int]:
        """The current epoch's DataLoader worker processes (its iterator's ``_workers``,
        which PyTorch has kept since 1.0); none for thread workers or no workers."""
        workers = getattr(self.iterator, "_workers", None) or ()
        return [w.pid for w in workers if w.pid is not None]

    def close(self) -> None:
        """End the workers now. A DataLoader with persistent workers keeps its iterator,
        and left to a garbage collection, its queues' feeder threads close before the
        iterator's own shutdown writes to them: each worker then waits out DataLoader's
        5 s join before it is killed, in whatever a later trial is measuring."""
        iterator, self.iterator = self.iterator, None
        kept = getattr(self.loader, "_iterator", None)  # persistent workers' iterator
        if kept is not None:
            self.loader._iterator = None
        try:
            if hasattr(iterator, "close"):  # a generator: the thread loader stops its threads
                iterator.close()
        finally:
            for each in (iterator, kept):  # with persistent workers, one: idempotent
                shutdown = getattr(each, "_shutdown_workers", None)
                try:
                    if shutdown is not None:
                        shutdown()
                except (OSError, RuntimeError) as exc:  # as __del__ would: the trial's error wins
                    log.warning("the loader's workers did not shut down cleanly: %s", exc)


@contextlib.contextmanager
def segment_batches(
    dataset: Dataset[Any], config: LoaderConfig, spec: SegmentSpec, seed: int
) -> Iterator[_Epochs]:
    """The candidate over ``dataset`` as the segment reads it (its engine's
    :meth:`~raytune_loader.engines.base.Engine.segment_loader`): one long epoch, endless,
    with the segment's thread count (not Ray's OMP_NUM_THREADS, which follows the
    reservation). Its workers or actors are gone when the block ends, however it ends."""
    torch.set_num_threads(spec.compute_threads)
    engine = engine_of(config)  # decided once for the segment: its batches say it
    samples = segment_samples(engine, spec)
    with engine.segment_loader(dataset, samples, seed, spec.loader_timeout) as loader:
        batches = _Epochs(loader, engine)
        del loader  # the engine's block collects it once the epochs are closed
        try:
            yield batches
        finally:
            batches.close()
            batches.loader = None


class _Window:
    """The measured window as it runs: each consumed batch (:class:`steady.Consumed`),
    each step's wait for its batch, the CPU time the step got.

    ``util`` by step timing, on a CPU, is the share of the window the training step
    would need at its own speed: the steady rate over the ceiling, the ceiling being the
    same step on a resident batch with the cores to itself. The plain share of the
    window not spent waiting, or the CPU time the step got, both reward a configuration
    whose loader workers slow the step down (contention for cores and caches,
    copy-on-write faults after each worker fork); useful work does not. It is not
    capped at 1: a ceiling measured too low must show, not flatten every fast
    configuration to the same 1.0. Without a ceiling it falls back to the CPU time the
    step got. On CUDA, where the step only queues work, it is the share not spent
    waiting for data. Every figure is taken over the steady wall time
    (:attr:`steady.Rate.wall_s`): where the workers took longer to make the window's
    batches than the loop took to train them, the loop was served from a stock.
    """

    def __init__(
        self, device: torch.device, makers: int, compute_threads: int,
        ceiling: float | None = None,
    ) -> None:  # fmt: skip
        self.cuda = device.type == "cuda"
        self.threads = compute_threads
        self.makers = makers  # the engine's makers of batches at once
        self.least = steady.HALF_BATCHES  # a half's fewest batches (fewer once cut)
        self.ceiling = ceiling
        self.batches: list[steady.Consumed] = []
        self.wait_s = 0.0
        self.waits: list[float] = []
        self.compute_cpu_s = 0.0
        self.start = time.monotonic()
        # One compute thread runs in the calling thread: its own clock excludes Ray's
        # and the pin-memory threads. More threads: the process clock, shared out.
        self.cpu_clock = time.thread_time if compute_threads == 1 else time.process_time

    @property
    def samples(self) -> int:
        return sum(b.samples for b in self.batches)

    def waited(self, seconds: float) -> None:
        self.wait_s += seconds
        self.waits.append(seconds)

    def steadiness(self) -> steady.Steadiness:
        return steady.steadiness(self.batches, self.start, self.makers, self.least)

    def wait_figures(self, wall: float) -> dict[str, Any]:
        """A step's wait for its batch: median, 99th percentile, the share of the window
        lost to the tail (:func:`~raytune_loader.machine.watch.wait_tail`), and every wait."""
        if not self.waits:
            return {}
        p50, p99, tail = watch.wait_tail(self.waits, wall)
        return {"data_wait_p50_s": p50, "data_wait_p99_s": p99, "data_wait_tail_frac": tail,
                "waits": tuple(self.waits)}  # fmt: skip

    def metrics(self, device_util: float | None = None) -> dict[str, Any]:
        """The window's figures over its steady wall time; ``device_util`` is NVML's
        share of the loop's own wall time."""
        held = self.steadiness()
        whole = held.whole
        wall = whole.wall_s
        busy = whole.consumed_s - self.wait_s  # the loop's time not waiting for a batch
        if device_util is not None:
            util = device_util / whole.stretch
        elif self.cuda:
            util = busy / wall
        elif self.ceiling:
            util = whole.samples_per_s / self.ceiling
        else:
            util = min(1.0, self.compute_cpu_s / (wall * self.threads))
        return {
            "samples_per_s": whole.samples_per_s,
            "data_wait_frac": 1.0 - busy / wall if wall else 0.0,
            "util": util,
            "util_source": "step-timing",
            "samples": whole.samples,
            "wall_s": wall,
            "steady": held.steady,
            "steady_ratio": held.ratio,
        }


def segment_samples(engine: Engine, spec: SegmentSpec) -> int:
    """Samples a rank reads in a segment: warm-up, drain and measured steps, as one epoch.

    A trial's subset holds a few batches; read epoch by epoch, the loader would drain
    its workers' queue every few steps and, without persistent workers, start them
    again, where a real epoch runs for thousands of batches. One epoch over the whole
    segment (the subset reshuffled as often as needed) measures the steady state the
    user's training sees.
    """
    return engine.config.batch_size * (warmup_batches(engine, spec) + spec.steps)


def warmup_batches(engine: Engine, spec: SegmentSpec) -> int:
    """Batches read before the window: the first, on which the warm-up steps train,
    then every batch the candidate can hold (its engine's
    :meth:`~raytune_loader.engines.base.Engine.in_flight`), so the window reads none of
    the stock the workers built while the first steps were slow."""
    drain = engine.in_flight()
    return min(_steps_on_first(spec, drain), 1) + drain


def _steps_on_first(spec: SegmentSpec, drain: int) -> int:
    """Steps trained on the first batch before the window: the warm-up steps, or one
    where there are none but a drain follows (the window then starts after the whole
    stock, the first batch not in it); none where the window starts at once."""
    return spec.warmup_steps or min(drain, 1)


def train_segment(
    dataset: Dataset[Any],
    trainer: Trainer,
    config: LoaderConfig,
    spec: SegmentSpec,
    *,
    report: ReportFn | None = None,
    seed: int = 0,
    ceiling: float | None = None,
) -> SegmentMetrics:
    """Warm up and drain (:func:`warmup_batches`), then train ``spec.steps`` measured
    steps, fewer where the drain or the window ran past its budget
    (:func:`steady.drained`, :func:`steady.over_budget`: a configuration far below the
    ceiling; never with several ranks, nor for an engine that needs its whole epoch:
    :attr:`~raytune_loader.engines.base.Engine.whole`); report every
    ``report_every``. The figures are the window's steady ones
    (:mod:`raytune_loader.measuring.steady`)."""
    size = None if isinstance(dataset, IterableDataset) else len(dataset)  # type: ignore[arg-type]
    if size is not None and size < config.batch_size:
        raise DataPipelineError(
            "data_loader", f"{size} samples, fewer than one batch of {config.batch_size}"
        )
    deadline = time.monotonic() + spec.time_limit_s
    non_blocking = config.pin_memory
    sampler: nvml.UtilizationSampler | None = None
    counts = count_requests(dataset)  # before the workers start: they add to it
    with segment_batches(dataset, config, spec, seed) as batches:
        cpus = min(hardware.usable_cpus(), 1 + config.num_workers)
        watcher = watch.Watcher(batches.worker_pids, cpus, active=spec.watch).start()
        engine_watch = batches.engine.segment_watch(batches.loader)
        # a store's requests as this process made them: a remote engine's makers (Ray
        # Data's actors) make theirs in their own processes and say so with their
        # batches (its segment watch counts them)
        counted = counts if counts and not batches.engine.remote else None
        watches = [w for w in (engine_watch, counted and StoreWatch(counted)) if w is not None]

        def fetch() -> tuple[Any, Stamped, float]:  # the next batch on the device, its
            asked = time.monotonic()  # stamps, and the loop's wait for it (not the copy)
            stamped = next(batches)
            waited = time.monotonic() - asked
            on_device = batch_on_device(trainer, stamped.batch, non_blocking, config)
            watcher.reads += batch_samples(on_device)
            return on_device, stamped, waited

        try:
            started = time.perf_counter()
            first, first_stamps, _ = fetch()
            trainer.sync()
            first_batch_s = time.perf_counter() - started  # workers' start-up, shards opened
            scope = _scope(dataset, sample_nbytes(first) // max(1, batch_samples(first)))
            # the step's own first costs (compilation, autotuning, allocation) on the
            # batch read: a batch the loader makes for each would time the loader too, and
            # a rule of thumb 80 ms from a bucket took 8 s for its five
            drain = batches.engine.in_flight()  # the stock built meanwhile, read out
            on_first = _steps_on_first(spec, drain)
            for done in range(on_first):
                trainer.step(first)
                _check_deadline(deadline, spec, f"{done + 1} of {on_first} warm-up steps")
            # several ranks step together (DDP's all-reduce in every step): one ending its
            # drain or window on its own clock would leave the others waiting in a step;
            # an engine whose figures need its epoch read to its end runs it whole
            may_cut = process_group()[1] == 1 and not batches.engine.whole
            at_ceiling_s = config.batch_size / ceiling if ceiling else 0.0  # a step's
            drain_samples = drain * config.batch_size
            drain_budget_s = steady.window_budget_s(drain_samples, ceiling) if may_cut else None
            cut, drain_start, step_s = False, time.monotonic(), 0.0
            for done in range(drain):
                on_device, _, waited = fetch()
                stepped = time.monotonic()
                trainer.step(on_device)
                _check_deadline(deadline, spec, f"{done + 1} of {drain} batches drained")
                no_stock = steady.drained(
                    waited, stepped - drain_start, drain_budget_s, max(at_ceiling_s, step_s)
                )
                step_s = time.monotonic() - stepped
                if no_stock and done + 1 < drain:
                    log.info(
                        "%s: drain ended after %d of %d batches: the loop waited %.3fs, no stock",
                        config.label(), done + 1, drain, waited,
                    )  # fmt: skip
                    cut = True
                    break
            first = None if on_first else first  # trained before the window, or measured
            trainer.sync()
            watcher.window_started()
            for each in watches:
                each.window_started()
            sampler = nvml.UtilizationSampler(_device_uuid(trainer.device))
            sampler.start()  # stopped in finally on any failure, so no NVML thread is left
            makers = batches.engine.producers()
            window = _Window(trainer.device, makers, spec.compute_threads, ceiling)
            window_samples = spec.steps * config.batch_size
            budget_s = steady.window_budget_s(window_samples, ceiling) if may_cut else None
            for step in range(1, spec.steps + 1):
                _check_deadline(deadline, spec, f"{step - 1} of {spec.steps} measured steps")
                fetch_start = time.monotonic()
                stamped = next(batches) if first is None else None
                window.waited(time.monotonic() - fetch_start)
                # the copy to the device is part of the step: a pageable copy waits for
                # the previous step's kernels, which is compute, not waiting for data
                if stamped is None:
                    on_device, stamped = first, first_stamps
                else:
                    on_device = batch_on_device(trainer, stamped.batch, non_blocking, config)
                    watcher.reads += batch_samples(on_device)
                first = None
                cpu_start = window.cpu_clock()
                trainer.step(on_device)
                window.compute_cpu_s += window.cpu_clock() - cpu_start
                if step == spec.steps // 2:
                    trainer.sync()  # the halves split where the device is, not the host
                window.batches.append(steady.Consumed.of(stamped, batch_samples(on_device)))
                # a window whose last step crosses its budget ran whole: not cut
                if step < spec.steps and steady.over_budget(
                    window.batches, window.start, budget_s, makers
                ):
                    window.least, cut = steady.short_half(makers), True
                    log.info(
                        "%s: window ended after %d of %d steps, at %gx its time at the ceiling",
                        config.label(), step, spec.steps, steady.WINDOW_BUDGET,
                    )  # fmt: skip
                    break
                if report is not None and step % spec.report_every == 0 and step < spec.steps:
                    trainer.sync()
                    report({**window.metrics(), "final": False})
            trainer.sync()
            window.batches[-1] = replace(window.batches[-1], ended=time.monotonic())
            reading = sampler.stop()
            watcher.window_ended()
            for each in watches:
                each.window_ended()
            # a segment cut short did not end its epoch: the next batch would not start one
            epoch_start_s = None if cut else _epoch_start(batches, fetch, trainer)
        finally:
            if sampler is not None:
                sampler.stop()  # idempotent: returns the same reading after a normal stop
            seen = watcher.stop()
    use_nvml = reading.source != "step-timing" and reading.util is not None
    fit = memoryfit.fit_memory(seen, scope)
    figures = window.metrics(reading.util if use_nvml else None)
    if not figures["steady"] and figures["steady"] is not None:
        log.info(
            "%s: the window's halves measured %.2fx apart: not steady",
            config.label(), figures["steady_ratio"],
        )  # fmt: skip
    return SegmentMetrics(
        **{**figures, "util_source": reading.source if use_nvml else "step-timing"},
        device_util=reading.device_util,
        first_batch_s=first_batch_s,
        epoch_start_s=epoch_start_s,
        **window.wait_figures(figures["wall_s"]),
        **watched_figures(seen, fit),
        **{k: v for each in watches for k, v in each.figures().items()},
        watch=seen,
        memory=fit,
    )


def _check_deadline(deadline: float, spec: SegmentSpec, where: str) -> None:
    if time.monotonic() > deadline:
        raise DataPipelineError(
            "timeout",
            f"the trial took longer than its limit of {spec.time_limit_s:.0f}s "
            f"(--trial-timeout) after {where}",
        )


def _epoch_start(batches: _Epochs, fetch: Callable[[], Any], trainer: Trainer) -> float | None:
    """Seconds from the end of the segment's epoch to the next epoch's first batch on the
    device: the workers started again, or kept (``persistent_workers``); None when the
    segment did not end an epoch (a stream's epoch is its shards)."""
    epochs = batches.started
    started = time.perf_counter()
    fetch()
    trainer.sync()
    return time.perf_counter() - started if batches.started > epochs else None


def _scope(dataset: Dataset[Any], sample_bytes: int) -> memoryfit.Scope:
    """What this rank reads: the trial's subset of the whole dataset (map-style), or a
    stream of unknown length."""
    ranks = process_group()[1]
    if isinstance(dataset, IterableDataset):
        return memoryfit.Scope(None, None, ranks, sample_bytes)
    whole = dataset.dataset if isinstance(dataset, Subset) else dataset
    objects = memoryfit.python_objects_bytes(whole)  # what copy-on-write can copy in a worker
    return memoryfit.Scope(len(dataset), len(whole), ranks, sample_bytes, objects)  # type: ignore[arg-type]


def watched_figures(seen: watch.Watch, fit: memoryfit.MemoryFit | None) -> dict[str, Any]:
    """The flat figures of what the watcher read: memory growth and its projection to
    one epoch of the whole dataset, and the worker processes' threads."""
    threads = seen.threads
    return {
        "memory_growth_per_sample": fit.per_sample if fit else None,
        "projected_epoch_growth_bytes": fit.epoch_growth() if fit else None,
        "watched_bytes": fit.current_bytes if fit else None,
        "memory_free_bytes": seen.free_bytes,
        "worker_thread_count": max((t.threads for t in threads), default=None),
        "worker_busy_threads": seen.busy_threads,
        "worker_cpu_s": sum(t.cpu_s for t in threads) if threads else None,
    }


def batch_on_device(trainer: Trainer, batch: Any, non_blocking: bool, config: LoaderConfig) -> Any:
    """The batch on the device; a JPEG that fails to decode there fails the trial as a
    corrupt sample, as it would in a worker."""
    with pipeline_failures(any_error=False):
        return trainer.to_device(batch, non_blocking, config)


def _device_uuid(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    return nvml.device_uuid_for_torch_device(index)
