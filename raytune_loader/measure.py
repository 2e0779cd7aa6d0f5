"""What a trial measures: a short training segment with one loader configuration.

:func:`run_trial` is the whole trial without Ray: build the pre-warmed subset and
the model, refuse configurations whose in-flight batches would not fit in host
memory or ``/dev/shm``, then train warm-up steps (not measured) and measured
steps, with CUDA out-of-memory back-off. The loop times how long it is blocked
waiting for the next batch apart from the rest of the step, which gives
``data_wait_frac`` and the median and 99th percentile of a step's wait; ``util``
comes from NVML per-process samples on a GPU and from the same step timing on a
CPU. A :class:`~raytune_loader.watch.Watcher` reads the processes' memory and
threads meanwhile, and after the window one more batch times the start of the next
epoch. :func:`measure_ceiling` trains the same model on a batch already on the
device: the speed of a perfect loader.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import psutil
import torch
from torch.utils.data import Dataset, IterableDataset, Subset

from raytune_loader import datasets, hardware, memoryfit, nvml, raydata, steady, streams, watch
from raytune_loader.backoff import run_with_backoff
from raytune_loader.batches import Stamped
from raytune_loader.errors import (
    BatchSizeTooSmallError,
    CorruptSampleError,
    DataPipelineError,
    TrialRefusedError,
    last_line,
)
from raytune_loader.job import SegmentSpec, TrialJob, subset_indices
from raytune_loader.loader import build_dataloader
from raytune_loader.memory import (
    bytes_in_flight,
    cap_gpu_memory,
    check_bytes,
    check_memory,
    sample_nbytes,
)
from raytune_loader.models import build_model
from raytune_loader.outcomes import InputRate, SegmentMetrics, TrialOutcome
from raytune_loader.sharding import process_group
from raytune_loader.space import LoaderConfig
from raytune_loader.step import Trainer, batch_samples, set_matmul_precision, user_trainer

log = logging.getLogger(__name__)
ReportFn = Callable[[dict[str, Any]], None]
CEILING_WINDOWS = 3  # the ceiling is the best of this many measured windows


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

    def __init__(self, loader: Any) -> None:
        self.loader = loader
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
    """The candidate loader over ``dataset`` as the segment reads it: one long epoch,
    endless, with the segment's thread count (not Ray's OMP_NUM_THREADS, which follows
    the reservation). Its workers are gone when the block ends, however it ends.

    The process's objects are frozen out of the garbage collector while the workers
    run (unless its caller froze them already): a forked worker's first full
    collection would otherwise write to every object it inherited and copy the main
    process's whole heap once (hundreds of MB for a process holding torch and a test
    session's modules), which the memory fit reads as a rate of copies per sample
    when its few private-memory readings straddle it. Reference counts still copy
    the pages of the objects a worker reads: what the fit is for. A Ray Data candidate
    (:func:`raytune_loader.raydata.segment_loader`) forks nothing: its actors are
    processes of the cluster, and its executions end with the block."""
    if config.engine == "raydata":
        with raydata.segment_loader(dataset, raydata.config_of(config), spec, seed) as loader:
            ray_batches = _Epochs(loader)
            try:
                yield ray_batches
            finally:
                ray_batches.close()
        return
    torch.set_num_threads(spec.compute_threads)
    freeze = gc.get_freeze_count() == 0
    loader = build_dataloader(
        dataset, config, timeout_s=spec.loader_timeout, seed=seed,
        samples_per_epoch=segment_samples(config, spec), stamp=True,
    )  # fmt: skip
    batches = _Epochs(loader)
    if freeze:
        gc.freeze()  # before the first batch forks the workers
    try:
        yield batches
    finally:
        batches.close()
        if freeze:
            gc.unfreeze()
        del loader
        gc.collect()


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
        self, device: torch.device, config: LoaderConfig, compute_threads: int,
        ceiling: float | None = None,
    ) -> None:  # fmt: skip
        self.cuda = device.type == "cuda"
        self.threads = compute_threads
        self.makers = steady.producers(config)
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
        return steady.steadiness(self.batches, self.start, self.makers)

    def wait_figures(self, wall: float) -> dict[str, Any]:
        """A step's wait for its batch: median, 99th percentile, the share of the window
        lost to the tail (:func:`~raytune_loader.watch.wait_tail`), and every wait."""
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


def segment_samples(config: LoaderConfig, spec: SegmentSpec) -> int:
    """Samples a rank reads in a segment: warm-up, drain and measured steps, as one epoch.

    A trial's subset holds a few batches; read epoch by epoch, the loader would drain
    its workers' queue every few steps and, without persistent workers, start them
    again, where a real epoch runs for thousands of batches. One epoch over the whole
    segment (the subset reshuffled as often as needed) measures the steady state the
    user's training sees.
    """
    return config.batch_size * (warmup_batches(config, spec) + spec.steps)


def warmup_batches(config: LoaderConfig, spec: SegmentSpec) -> int:
    """Batches trained before the window: the warm-up steps, then every batch the
    loader can hold (:func:`steady.in_flight`), so the window reads none of the stock
    the workers built while the first steps were slow."""
    return spec.warmup_steps + steady.in_flight(config)


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
    steps; report every ``report_every``. The figures are the window's steady ones
    (:mod:`raytune_loader.steady`)."""
    size = None if isinstance(dataset, IterableDataset) else len(dataset)  # type: ignore[arg-type]
    if size is not None and size < config.batch_size:
        raise DataPipelineError(
            "data_loader", f"{size} samples, fewer than one batch of {config.batch_size}"
        )
    deadline = time.monotonic() + spec.time_limit_s
    non_blocking = config.pin_memory
    sampler: nvml.UtilizationSampler | None = None
    with segment_batches(dataset, config, spec, seed) as batches:
        cpus = min(hardware.usable_cpus(), 1 + config.num_workers)
        watcher = watch.Watcher(batches.worker_pids, cpus, active=spec.watch).start()
        ray_watch = batches.loader.watch if config.engine == "raydata" else None

        def fetch() -> tuple[Any, Stamped]:  # the next batch on the device, its stamps
            stamped = next(batches)
            on_device = _on_device(trainer, stamped.batch, non_blocking, config)
            watcher.reads += batch_samples(on_device)
            return on_device, stamped

        try:
            started = time.perf_counter()
            first, first_stamps = fetch()
            trainer.sync()
            first_batch_s = time.perf_counter() - started  # workers' start-up, shards opened
            scope = _scope(dataset, sample_nbytes(first) // max(1, batch_samples(first)))
            warm_up = warmup_batches(config, spec)
            for done in range(warm_up):
                trainer.step(first if done == 0 else fetch()[0])
                _check_deadline(deadline, spec, f"{done + 1} of {warm_up} warm-up steps")
            first = None if warm_up else first  # trained in the warm-up, or measured
            trainer.sync()
            watcher.window_started()
            if ray_watch is not None:
                ray_watch.window_started()
            sampler = nvml.UtilizationSampler(_device_uuid(trainer.device))
            sampler.start()  # stopped in finally on any failure, so no NVML thread is left
            window = _Window(trainer.device, config, spec.compute_threads, ceiling)
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
                    on_device = _on_device(trainer, stamped.batch, non_blocking, config)
                    watcher.reads += batch_samples(on_device)
                first = None
                cpu_start = window.cpu_clock()
                trainer.step(on_device)
                window.compute_cpu_s += window.cpu_clock() - cpu_start
                if step == spec.steps // 2:
                    trainer.sync()  # the halves split where the device is, not the host
                window.batches.append(steady.Consumed.of(stamped, batch_samples(on_device)))
                if report is not None and step % spec.report_every == 0 and step < spec.steps:
                    trainer.sync()
                    report({**window.metrics(), "final": False})
            trainer.sync()
            window.batches[-1] = replace(window.batches[-1], ended=time.monotonic())
            reading = sampler.stop()
            watcher.window_ended()
            if ray_watch is not None:
                ray_watch.window_ended()
            epoch_start_s = _epoch_start(batches, fetch, trainer)
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
        **(ray_watch.figures() if ray_watch is not None else {}),
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


def _on_device(trainer: Trainer, batch: Any, non_blocking: bool, config: LoaderConfig) -> Any:
    """The batch on the device; a JPEG that fails to decode there fails the trial as a
    corrupt sample, as it would in a worker."""
    with pipeline_failures(any_error=False):
        return trainer.to_device(batch, non_blocking, config)


def _device_uuid(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    return nvml.device_uuid_for_torch_device(index)


def prepare(
    job: TrialJob, slot: int = 0, config: LoaderConfig | None = None
) -> tuple[Dataset[Any], int]:
    """What a measurement of ``config`` reads, with the worker-side stages of its
    pipeline variant: the trial's subset, or its stream over the trial's shards; and
    the bytes of one of its samples."""
    config = config or LoaderConfig(batch_size=1)
    accesses = job.dataset.source.accesses(job.dataset)
    if config.engine == "raydata" and config.access not in accesses:
        # a Ray Data candidate on a stream-only source: its actors read the stream's shards
        config = raydata.config_of(config).source_variant(accesses[0])
    elif config.access not in accesses:  # the ceiling's one batch, from a stream-only source
        config = replace(config, access=accesses[0], batching="loader")
    if config.access == "stream":
        stream = streams.stream_for_trial(job, config, slot)
        first = _first_sample(stream)
        per_item = config.batch_size if config.batching == "workers" else 1
        return stream, sample_nbytes(first) // per_item
    full = datasets.dataset_for_trial(job.dataset, config.transfer, config.decode)
    indices = subset_indices(len(full), job.samples_per_trial, job.seed, slot if job.cold else 0)
    subset = Subset(full, indices)
    return subset, sample_nbytes(_first_sample(subset))


def _first_sample(dataset: Dataset[Any]) -> Any:
    """Sample 0 (a stream's first), with its failure turned into the same reasons a
    loader failure gets."""
    with pipeline_failures():
        if isinstance(dataset, IterableDataset):
            first = streams.first_of(dataset)
            if first is None:
                raise DataPipelineError("data_loader", "the stream yielded no sample")
            return first
        return dataset[0]


def job_trainer(job: TrialJob, num_classes: int) -> Trainer:
    """The job's training step on its device, seeded, within its share of GPU memory:
    the same for a trial, the ceiling, verification and the bench."""
    torch.manual_seed(job.seed)
    device = torch.device(job.device)
    cap_gpu_memory(job.gpu_memory_share, device)
    if job.precision is not None:  # None: the user's step keeps torch's own settings
        set_matmul_precision(job.precision)
    if job.train_step:
        return user_trainer(job.train_step, device, num_classes, job.channels_last)
    model = build_model(job.model, num_classes)
    precision = job.precision or "fp32"
    return Trainer.for_model(model, device, precision, job.channels_last, job.compile)


def run_trial(
    job: TrialJob, config: LoaderConfig, report: ReportFn | None = None, slot: int = 0
) -> TrialOutcome:
    """One trial, start to end; expected failures come back as ``TrialOutcome.failure``."""
    cpus = job.cpus_reserved(config)
    try:
        subset, sample_bytes = prepare(job, slot, config)
    except DataPipelineError as exc:
        return TrialOutcome(config, cpus, 0, failure=exc.reason, detail=str(exc))
    try:
        host = _check_memory(job, config, sample_bytes)
    except TrialRefusedError as exc:
        host = _in_flight_bytes(config, sample_bytes)[0]
        return TrialOutcome(config, cpus, host, failure=exc.reason, detail=str(exc))
    trainer = job_trainer(job, datasets.num_classes(job.dataset, subset))

    def segment(batch_size: int) -> SegmentMetrics:
        config_at = config.with_batch_size(batch_size)
        ceiling = job.ceilings.get(batch_size)
        backoffs = (config.batch_size // batch_size).bit_length() - 1
        at_size = None
        if report is not None:  # interim reports too: ASHA may stop the trial after one

            def at_size(metrics: dict[str, Any]) -> None:
                report({**metrics, "effective_batch_size": batch_size, "oom_backoffs": backoffs})

        return train_segment(
            subset, trainer, config_at, job.segment, report=at_size, seed=job.seed, ceiling=ceiling
        )

    try:
        outcome = run_with_backoff(segment, config.batch_size, job.min_batch_size)
    except BatchSizeTooSmallError as exc:
        return TrialOutcome(config, cpus, host, failure="oom", detail=str(exc))
    except DataPipelineError as exc:
        return TrialOutcome(config, cpus, host, failure=exc.reason, detail=str(exc))
    return TrialOutcome(
        config,
        cpus,
        host,
        metrics=outcome.value,
        effective_batch_size=outcome.effective_batch_size,
        oom_backoffs=outcome.backoffs,
        ceiling_samples_per_s=job.ceilings.get(outcome.effective_batch_size),
    )


def _in_flight_bytes(config: LoaderConfig, sample_bytes: int) -> tuple[int, int]:
    """(host bytes, /dev/shm bytes) ``config`` holds ahead of the loop: a DataLoader's
    batches (:func:`raytune_loader.memory.bytes_in_flight`), or a Ray Data candidate's
    prefetched batches and what its object store holds on this node."""
    if config.engine == "raydata":
        return raydata.bytes_in_flight(raydata.config_of(config), sample_bytes)
    return bytes_in_flight(config, sample_bytes)


def _check_memory(job: TrialJob, config: LoaderConfig, sample_bytes: int) -> int:
    """Refuse ``config`` when what it holds ahead would not fit in this rank's share of
    RAM and ``/dev/shm``; its host bytes in flight."""
    free = hardware.shm_bytes()  # with several ranks, each checks its share of both
    ram = psutil.virtual_memory().available // job.ranks
    shm = None if free is None else free // job.ranks
    if config.engine == "raydata":
        host, store = _in_flight_bytes(config, sample_bytes)
        return check_bytes(config.label(), host, store, ram, shm, "object store blocks")
    return check_memory(config, sample_bytes, ram, shm)


def measure_ceiling(
    job: TrialJob, batch_size: int, windows: int = CEILING_WINDOWS
) -> tuple[int, float]:
    """(effective batch size, samples/s) training on one batch already on the device,
    the best of ``windows`` measured windows."""
    subset, _ = prepare(job)
    trainer = job_trainer(job, datasets.num_classes(job.dataset, subset))

    def resident(bs: int) -> float:
        torch.set_num_threads(job.segment.compute_threads)
        first = next(iter(build_dataloader(subset, LoaderConfig(batch_size=bs), seed=job.seed)))
        batch = trainer.to_device(first, non_blocking=False)
        for _ in range(job.segment.warmup_steps):  # compilation, if any, happens here
            trainer.step(batch)
        trainer.sync()
        speeds = []
        for _ in range(windows):  # a best case: anything else running only slows it
            start = time.perf_counter()
            for _ in range(job.segment.steps):
                trainer.step(batch)
            trainer.sync()
            speeds.append(bs * job.segment.steps / (time.perf_counter() - start))
        return max(speeds)

    outcome = run_with_backoff(resident, batch_size, job.min_batch_size)
    return outcome.effective_batch_size, outcome.value


def measure_input(
    job: TrialJob, config: LoaderConfig, slot: int = 0, windows: int = CEILING_WINDOWS
) -> InputRate:
    """``config``'s loader over the trial's subset with the variant's device-side
    stages and no model, the best of ``windows`` windows of as many batches as a trial
    measures (a bound, like the ceiling: whatever runs beside it only slows it); then
    the worker-side stages of a few samples on one core."""
    subset, _ = prepare(job, slot, config)
    spec = job.segment
    device = torch.device(job.device)
    cap_gpu_memory(job.gpu_memory_share, device)  # a device-side decode allocates there too
    trainer = Trainer(lambda batch: None, device, job.channels_last, "the input pipeline")
    wide = replace(spec, steps=spec.steps * windows)  # one epoch holds every window

    def fetch() -> steady.Consumed:
        stamped = next(batches)
        on_device = _on_device(trainer, stamped.batch, config.pin_memory, config)
        return steady.Consumed.of(stamped, batch_samples(on_device))

    rates = []
    with segment_batches(subset, config, wide, job.seed) as batches:
        for _ in range(warmup_batches(config, spec)):
            fetch()
        for _ in range(windows):
            trainer.sync()
            start = time.monotonic()
            read = [fetch() for _ in range(spec.steps)]
            trainer.sync()
            read[-1] = replace(read[-1], ended=time.monotonic())
            rates.append(steady.rate(read, start, steady.producers(config)).samples_per_s)
    return InputRate(max(rates), worker_side_rate(subset))


def worker_side_rate(dataset: Dataset[Any], samples: int = 64) -> float:
    """Samples per second one core reads, decodes and augments (what a worker does); a
    stream is read in order, a batch made in its pipeline counting as its samples."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if isinstance(dataset, IterableDataset):
            items = iter(dataset)
            for _ in range(8):  # warm the code paths
                next(items)
            started, count = time.perf_counter(), 0
            while count < samples:
                item = next(items)
                count += batch_samples(item) if _batched(dataset) else 1
            return count / (time.perf_counter() - started)
        count = min(samples, len(dataset))  # type: ignore[arg-type]
        for i in range(min(8, count)):  # warm the code paths
            dataset[i]
        started = time.perf_counter()
        for i in range(count):
            dataset[i]
        return count / (time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)


def _batched(dataset: Any) -> bool:
    return getattr(dataset, "batched_in_workers", False)
