"""One measurement in one process: a trial, the ceiling, or the input pipeline alone.

:func:`run_trial` is the whole trial without Ray: build the pre-warmed subset and the
model, refuse a candidate whose batches in flight would not fit in host memory or
``/dev/shm``, then train its segment (:mod:`raytune_loader.measuring.segment`) with
CUDA out-of-memory back-off. :func:`measure_ceiling` trains the same model on a batch
already on the device (the speed of a perfect loader); :func:`measure_input` reads the
candidate's batches with no model (the speed of its input pipeline alone).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import torch
from torch.utils.data import Dataset, IterableDataset, Subset

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.engines import Held, engine_of
from raytune_loader.errors import (
    BatchSizeTooSmallError,
    DataPipelineError,
    TrialRefusedError,
)
from raytune_loader.loaders.batches import set_cached
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.machine import hardware
from raytune_loader.measuring import shards, steady
from raytune_loader.measuring.backoff import run_with_backoff
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.memory import (
    cap_gpu_memory,
    check_bytes,
    sample_nbytes,
)
from raytune_loader.measuring.models import build_model
from raytune_loader.measuring.outcomes import InputRate, SegmentMetrics, TrialOutcome
from raytune_loader.measuring.segment import (
    ReportFn,
    batch_on_device,
    pipeline_failures,
    segment_batches,
    train_segment,
    warmup_batches,
)
from raytune_loader.measuring.step import Trainer, batch_samples, set_matmul_precision, user_trainer
from raytune_loader.sources import datasets
from raytune_loader.stores.cache import USED, ObjectCache, default_budget, default_folder
from raytune_loader.stores.store import count_requests

log = logging.getLogger(__name__)


CEILING_WINDOWS = 3  # the ceiling is the best of this many measured windows
_CHECKED: dict[tuple[Any, ...], int] = {}  # a stream's first sample's bytes, checked here


def prepare(
    job: TrialJob, slot: int = 0, config: LoaderConfig | None = None, *, check: bool = True
) -> tuple[Dataset[Any], int]:
    """What a measurement of ``config`` reads, with the worker-side stages of its
    pipeline variant: the trial's subset, or its stream over the trial's shards; and
    the bytes of one of its samples, read to check it (0 without ``check``; a stream's
    from the stream without its shuffle buffer, and from a store the first bytes of
    its first shard where its span starts there, :func:`~shards.checked_head`, once a
    process for each variant and first shard)."""
    config = config or LoaderConfig(batch_size=1)
    datasets.adopt_listing(job.dataset, job.listing)  # the driver's: no listing again here
    config = engine_of(config).source_variant(job.dataset.source.accesses(job.dataset))
    if config.access == "stream":
        stream = shards.stream_for_trial(job, config, slot)
        if not check:
            return stream, 0
        # from a bucket, the trial's first shard's first bytes (a Parquet file's footer
        # and first row groups), where its span starts the shard (ranged GETs; the
        # whole 5 MB shard at 100 Mbit/s took 0.4-0.5 s).
        # Its bytes are the variant's and the shard's alone: a reused process checks
        # them once.
        key = (job.dataset, tuple(shards.trial_shards(job, slot)[:1]), shards.variant(job, config))
        if key not in _CHECKED:
            first = _first_sample(shards.checked_head(stream))
            per_item = config.batch_size if config.batching == "workers" else 1
            _CHECKED[key] = sample_nbytes(first) // per_item
        return stream, _CHECKED[key]
    full = datasets.dataset_for_trial(job.dataset, config.transfer, config.decode)
    indices = datasets.subset_indices(
        len(full), job.samples_per_trial, job.seed, slot if job.cold else 0
    )
    subset = Subset(full, indices)
    return subset, sample_nbytes(_first_sample(subset)) if check else 0


def _first_sample(dataset: Dataset[Any]) -> Any:
    """Sample 0 (a stream's first), with its failure turned into the same reasons a
    loader failure gets."""
    with pipeline_failures():
        if isinstance(dataset, IterableDataset):
            first = shards.first_of(dataset)
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
    held = engine_of(config).held(sample_bytes)
    try:
        host = _check_memory(job, config.label(), held)
    except TrialRefusedError as exc:
        return TrialOutcome(config, cpus, held.host, failure=exc.reason, detail=str(exc))
    try:
        with cold_pass(job, config, subset) as cold:
            return _trained(job, config, subset, report, cpus, host, cold)
    except DataPipelineError as exc:  # the cold pass's
        return TrialOutcome(config, cpus, host, failure=exc.reason, detail=str(exc))


def _trained(
    job: TrialJob,
    config: LoaderConfig,
    subset: Dataset[Any],
    report: ReportFn | None,
    cpus: float,
    host: int,
    cold: dict[str, Any],
) -> TrialOutcome:
    """The trial's segment (backing off the batch size on OOM) and its outcome."""
    trainer = job_trainer(job, datasets.num_classes(job.dataset, subset))

    def segment(batch_size: int) -> SegmentMetrics:
        config_at = config.with_batch_size(batch_size)
        ceiling = job.ceilings.get(batch_size)
        backoffs = (config.batch_size // batch_size).bit_length() - 1
        at_size = None
        if report is not None:  # interim reports too: ASHA may stop the trial after one

            def at_size(metrics: dict[str, Any]) -> None:
                report({**metrics, **cold, "effective_batch_size": batch_size,
                        "oom_backoffs": backoffs})  # fmt: skip

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
        metrics=replace(outcome.value, **cold),
        effective_batch_size=outcome.effective_batch_size,
        oom_backoffs=outcome.backoffs,
        ceiling_samples_per_s=job.ceilings.get(outcome.effective_batch_size),
    )


@contextlib.contextmanager
def cold_pass(
    job: TrialJob, config: LoaderConfig, dataset: Dataset[Any]
) -> Iterator[dict[str, Any]]:
    """For a candidate that keeps a bucket's objects in a local cache: the cache filled by
    one pass over ``dataset`` with the candidate's loader, as a first epoch fills it
    (that pass's rate and requests are yielded, as ``cold_*`` figures); what is measured
    inside the block reads the warm cache, as every later epoch does. Nothing for any
    other candidate.

    The cache is a fresh folder of the measurement's own, which no earlier measurement
    warmed, removed at the end. Where ``job.shared_cache`` names a folder made on this
    host (a search's trials, without ``--cold``, of one rank), the first cache trial
    keeps its filled folder there where its pass kept every object, and the later ones
    read it warm, with no pass and no ``cold_*`` figures of their own. Their windows
    measure the state their own pass would have left: the same objects, in files on the
    same disk."""
    if not config.cache:
        yield {}
        return
    shared = _shared_cache(job)
    if shared is not None and shared.is_dir():  # an earlier trial's pass filled it
        set_cached(dataset, True, _cache(job, shared))
        try:
            yield {}
        finally:
            set_cached(dataset, False)
        return
    folder = _measurement_cache()
    try:
        set_cached(dataset, True, _cache(job, folder))
        counts = count_requests(dataset)
        before = counts.totals()["requests"] if counts else 0
        started = time.perf_counter()
        with pipeline_failures():
            loader = build_dataloader(dataset, config, drop_last=False, seed=job.seed)
            # every sample of the subset once: of this rank's share, with several ranks
            read = sum(batch_samples(batch) for batch in loader)
        seconds = time.perf_counter() - started
        del loader
        requests = counts.totals()["requests"] - before if counts else None
        log.info("cold pass of %s: %d samples in %.2f s, %s GETs", config.label(), read,
                 seconds, requests)  # fmt: skip
        if shared is not None and _kept(folder, shared, read):  # filled: the later ones' too
            folder = shared
            set_cached(dataset, True, _cache(job, shared))
        yield {"cold_samples_per_s": read / seconds, "cold_store_requests": requests}
    finally:  # the dataset may be this process's for the next measurement too
        set_cached(dataset, False)
        if folder != shared:
            shutil.rmtree(folder, ignore_errors=True)


def _cache(job: TrialJob, folder: Path) -> ObjectCache:
    budget = job.cache_bytes if job.cache_bytes is not None else default_budget(folder)
    return ObjectCache(folder, budget)


MEASURING = "measuring"  # beside training's cache folder: its disk, not a tmpfs
HOST = ".host"  # a search's shared folder: the host it was made on


def _measurement_cache() -> Path:
    """A fresh folder for one measurement's cache, on the disk training's cache is on
    (``/tmp`` is often memory), named by this host and process."""
    return Path(tempfile.mkdtemp(prefix=_prefix("cache"), dir=_measuring_root()))


def _prefix(kind: str) -> str:
    return f"{kind}-{os.getpid()}-{socket.gethostname()}-"


def _measuring_root() -> Path:
    """The measurements' folder; what processes of this host that are gone left there (a
    trial killed mid-measurement, a search ended by a signal) removed first. (A home on a
    network disk is shared by hosts: another host's process is not looked for here.)"""
    root = default_folder().parent / MEASURING
    root.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    for stale in [*root.glob("cache-*-*"), *root.glob("search-*-*")]:
        _, pid, rest = stale.name.split("-", 2)
        here = rest.startswith(f"{host}-") or "-" not in rest  # or named before hosts were
        if pid.isdigit() and here and not psutil.pid_exists(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return root


@contextlib.contextmanager
def search_cache(wanted: bool = True) -> Iterator[Path | None]:
    """A folder for ``TrialJob.shared_cache`` (where ``wanted``: the space offers the
    cache), named by this host and process, removed at the end; None where it cannot be
    made: each measurement then fills a cache of its own."""
    folder = None
    try:
        if wanted:
            folder = Path(tempfile.mkdtemp(prefix=_prefix("search"), dir=_measuring_root()))
            (folder / HOST).write_text(socket.gethostname())
    except OSError:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        folder = None
    try:
        yield folder
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _shared_cache(job: TrialJob) -> Path | None:
    """The shared cache's folder, where ``job`` has one made on this host; none with
    ``--cold`` (each measurement reads a subset of its own) or several ranks (each
    reads its own share of the subset)."""
    if job.shared_cache is None or job.cold or job.ranks > 1:
        return None
    try:
        made_on = Path(job.shared_cache, HOST).read_text()
    except OSError:  # another node's: each measurement fills its own
        return None
    return Path(job.shared_cache, "objects") if made_on == socket.gethostname() else None


def _kept(folder: Path, shared: Path, objects: int) -> bool:
    """Whether ``folder`` became ``shared``: where its pass kept all ``objects`` (not a
    budget spent, or a write that failed, part of the way), and no measurement beside
    this one kept its own there first."""
    held = sum(1 for p in folder.rglob("*") if p.is_file() and p.name != USED)
    if held < objects:
        return False
    try:
        folder.rename(shared)
    except OSError:
        return False
    return True


def _check_memory(job: TrialJob, label: str, held: Held) -> int:
    """Refuse a candidate (``label``) when what it holds ahead would not fit in this
    rank's share of RAM and ``/dev/shm``; its host bytes in flight."""
    free = hardware.shm_bytes()  # with several ranks, each checks its share of both
    ram = psutil.virtual_memory().available // job.ranks
    shm = None if free is None else free // job.ranks
    return check_bytes(label, held, ram, shm)


def measure_ceiling(
    job: TrialJob, batch_size: int, windows: int = CEILING_WINDOWS
) -> tuple[int, float]:
    """(effective batch size, samples/s) training on one batch already on the device,
    the best of ``windows`` measured windows. A stream's batch is read without its
    shuffle buffer (:func:`~raytune_loader.measuring.shards.unbuffered`): any batch of
    the data's shape times the model, and filling the buffer read every shard first (a
    bucket's 8 shards of 5 MB: 5 of an 11.5 s ceiling)."""
    subset, _ = prepare(job)
    trainer = job_trainer(job, datasets.num_classes(job.dataset, subset))
    read = shards.unbuffered(subset)

    def resident(bs: int) -> float:
        torch.set_num_threads(job.segment.compute_threads)
        first = next(iter(build_dataloader(read, LoaderConfig(batch_size=bs), seed=job.seed)))
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
    the worker-side stages of a few samples on one core (a stream's without its shuffle
    buffer, whose fill from a bucket took a single reader seconds). A cache candidate's
    reads its warm cache, as its trials do (:func:`cold_pass`)."""
    subset, _ = prepare(job, slot, config)
    with cold_pass(job, config, subset):
        return _input_rate(job, config, subset, windows)


def _input_rate(
    job: TrialJob, config: LoaderConfig, subset: Dataset[Any], windows: int
) -> InputRate:
    spec = job.segment
    device = torch.device(job.device)
    cap_gpu_memory(job.gpu_memory_share, device)  # a device-side decode allocates there too
    trainer = Trainer(lambda batch: None, device, job.channels_last, "the input pipeline")
    wide = replace(spec, steps=spec.steps * windows)  # one epoch holds every window

    def fetch() -> steady.Consumed:
        stamped = next(batches)
        on_device = batch_on_device(trainer, stamped.batch, config.pin_memory, config)
        return steady.Consumed.of(stamped, batch_samples(on_device))

    rates = []
    with segment_batches(subset, config, wide, job.seed) as batches:
        makers = batches.engine.producers()
        for _ in range(warmup_batches(batches.engine, spec)):
            fetch()
        for _ in range(windows):
            trainer.sync()
            start = time.monotonic()
            read = [fetch() for _ in range(spec.steps)]
            trainer.sync()
            read[-1] = replace(read[-1], ended=time.monotonic())
            rates.append(steady.rate(read, start, makers).samples_per_s)
    return InputRate(max(rates), worker_side_rate(shards.unbuffered(subset)))


WARM_SAMPLES = 8  # read before a worker side is timed, to warm its code paths


def worker_side_rate(
    dataset: Dataset[Any], samples: int = 64, timing: Callable[[], None] | None = None
) -> float:
    """Samples per second one core reads, decodes and augments (what a worker does): of
    :func:`worker_side_read`."""
    count, seconds = worker_side_read(dataset, samples, timing)
    return count / seconds


def worker_side_read(
    dataset: Dataset[Any], samples: int = 64, timing: Callable[[], None] | None = None
) -> tuple[int, float]:
    """The samples one core read, decoded and augmented as a worker does, at least
    ``samples`` (a stream's batches made in its pipeline count as their samples, and
    its last may go past them), and the seconds they took. A stream is read in order.
    ``timing`` is called when the timed samples start, after the warm-up (a stream's
    shuffle buffer filled then)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if isinstance(dataset, IterableDataset):
            items = iter(dataset)
            for _ in range(WARM_SAMPLES):  # warm the code paths
                next(items)
            if timing is not None:
                timing()
            started, count = time.perf_counter(), 0
            while count < samples:
                item = next(items)
                count += batch_samples(item) if _batched(dataset) else 1
            return count, time.perf_counter() - started
        count = min(samples, len(dataset))  # type: ignore[arg-type]
        for i in range(min(WARM_SAMPLES, count)):  # warm the code paths
            dataset[i]
        if timing is not None:
            timing()
        started = time.perf_counter()
        for i in range(count):
            dataset[i]
        return count, time.perf_counter() - started
    finally:
        torch.set_num_threads(threads)


def _batched(dataset: Any) -> bool:
    return getattr(dataset, "batched_in_workers", False)
