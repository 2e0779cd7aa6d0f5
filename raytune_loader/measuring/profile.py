"""The profile phase: what each stage of the input pipeline costs, measured before the trials.

A pipeline's speed is bounded by the training step (the ceiling), by its workers
(how many, times what one core does per sample) and by what the training process
itself spends per batch besides the step: receiving a batch from a worker process
(unpickling, rebuilding it from shared memory) or a thread, and the device-side
stages (normalizing a uint8 batch, decoding JPEGs on the device). :func:`profile`
measures each of those once, per structure of the space (decoder x transfer, and
worker kind for what the training process receives), in one measurement process,
so :mod:`raytune_loader.tuning.costmodel` can predict every candidate of the space from
them. On a CPU it runs the step's thread count, as a trial does. Where the space offers
Ray Data and the profile runs beside an actor's bundle (the search's), it times what
taking batches out of the object store costs the training process's node, from an
actor on another node (:func:`raytune_loader.raydata.receive_cost.receive_seconds`).
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, Subset, default_collate

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.candidates.rules import FETCH_THREADS
from raytune_loader.candidates.structure import structure
from raytune_loader.engines import engine_of
from raytune_loader.engines.raydata import RayDataEngine
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.loaders.shard_stream import ShardStream
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.measure import (
    WARM_SAMPLES,
    cold_pass,
    job_trainer,
    prepare,
    worker_side_rate,
    worker_side_read,
)
from raytune_loader.measuring.shards import opened, unbuffered
from raytune_loader.measuring.step import Trainer
from raytune_loader.pipeline.device import collate_encoded
from raytune_loader.raydata.receive_cost import in_placement_group, receive_seconds
from raytune_loader.sources import datasets
from raytune_loader.sources.remote_folder import keys_of
from raytune_loader.stores.kept import kept as kept_objects
from raytune_loader.stores.kept import served
from raytune_loader.stores.probe import latency, ramp_per_thread, top_rate
from raytune_loader.stores.store import Counts, count_requests, store_of, thread_gets
from raytune_loader.wrapped import wrapped

SAMPLES = 32  # samples a variant's worker side is timed on, after warming its code paths
# threads that read a store's single objects for the worker side, each on its own CPU
# clock: one at a time, 30 ms away, each variant's 40 samples took 1.8 s of the profile
READERS = 4
BATCHES = 6  # batches a receive or a device-side finish is timed on
ROUNDS = 3  # rounds of timed finishes, the quickest taken


@dataclass(frozen=True)
class Profile:
    """Measured costs; seconds are per batch of ``batch_size`` samples."""

    batch_size: int
    cores: int  # usable CPUs of the node (workers and the step share them on a CPU)
    per_core: dict[str, float] = field(default_factory=dict)  # structure -> samples/s a core
    # structure -> samples/s a core reading a warm local cache of a bucket's objects (a
    # file, no request): measured where the space offers the cache
    cached_per_core: dict[str, float] = field(default_factory=dict)
    collate_s: dict[str, float] = field(default_factory=dict)  # structure -> s a batch
    receive_s: dict[str, float] = field(default_factory=dict)  # kind/transfer -> s a batch
    # kind/transfer -> s a batch: a worker collating ready samples and handing the batch
    # over (a process collates into shared memory and sends it; a thread queues it)
    hand_over_s: dict[str, float] = field(default_factory=dict)
    finish_s: dict[str, float] = field(default_factory=dict)  # structure -> s a batch
    # an object store's request: its mean seconds, first byte to last (0: local data);
    # per_core is then the CPU's pace alone, this wait taken out
    fetch_s: float = 0.0
    requests_per_sample: float = 1.0  # a GET an object; a shard's GET over its samples
    store_rate: float = 0.0  # GETs/s the store answered at most (ramped); 0: local data
    store_latency: dict[str, Any] = field(default_factory=dict)  # stores.Latency's figures
    seconds: float = 0.0  # how long the profile took

    @property
    def server_cpu_s(self) -> float:
        """A store's CPU-seconds a request where its server runs on this node, on the
        cores the trials use (:mod:`raytune_loader.stores.colocated`); 0 for a store
        elsewhere, or local data."""
        # (a profile pickled by 0.1, resumed, has no store_latency)
        latency = getattr(self, "store_latency", None) or {}
        return float(latency.get("server_cpu_s_per_request") or 0.0)

    def as_dict(self) -> dict[str, Any]:
        """Every cost, as ``best_config.json`` records it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Profile:
        """The profile :meth:`as_dict` recorded."""
        return cls(**values)


@dataclass
class Gets:
    """A worker side's GET figures, from the first structure's that made GETs: what a
    GET cost the reading thread's CPU (a stream's, by the GET's own clock; single
    objects', by the difference its reads made, :func:`_objects_side`), a GET's
    seconds, first byte to last, and the GETs a sample took. The other structures'
    worker sides read the objects it fetched, which the profile kept
    (:func:`~raytune_loader.stores.kept.kept`), and take these: an object's GET costs
    the same whatever decodes it (each structure fetching its own again took 7 s of a
    22 s profile on a bucket's shards, and 4 s of 17 s on its single objects 80 ms
    away). One for single objects, one for streams."""

    cpu_s: float | None = None  # None: no worker side has made a GET yet
    request_s: float = 0.0
    per_sample: float = 1.0


def profile(job: TrialJob, structures: list[LoaderConfig], cores: int) -> Profile:
    """Every cost the cost model needs, for the given structures (one configuration of
    each decoder x transfer x worker kind the space offers, with workers)."""
    started = time.perf_counter()
    # the smallest batch the trials train at: every cost here grows with the batch (the
    # samples made, the steps between the finishes), and the model scales it to the
    # others; at the largest (1024 on an H200) the profile took 82 s
    batch = min(job.ceilings) if job.ceilings else structures[0].batch_size
    threads = torch.get_num_threads()
    torch.set_num_threads(job.segment.compute_threads)
    per_core, collate_s, receive_s, hand_over_s, finish_s = {}, {}, {}, {}, {}
    cached_per_core: dict[str, float] = {}
    fetch_s = store_rate = 0.0
    requests_per_sample = 1.0
    store_latency: dict[str, Any] = {}
    trainer: Trainer | None = None
    remote = any(engine_of(c).remote for c in structures)
    beside_an_actor = remote and in_placement_group()  # the search's: an actor's too
    kept: dict[str, bytes] = {}
    gets = {kind: Gets() for kind in ("objects", "stream")}
    try:
        for config in structures:
            config = config.with_batch_size(batch)
            key, kind = structure(config).worker_side, structure(config).receiving
            asked = (key not in per_core, bool(config.cache and key not in cached_per_core),
                     kind not in receive_s and config.num_workers > 0)  # fmt: skip
            # read where something is measured of it, unchecked: the search checked the
            # data, and a stream's first sample waits for its buffer (87 of those 216 s)
            dataset = prepare(job, 0, config, check=False)[0] if any(asked) else None
            # a stream without its shuffle buffer, for its worker side and its untimed
            # samples (collated, finished, handed over): filling it read every shard for
            # each (on a bucket's 5 MB shards, 40 of a 216 s profile, then 38 of 62 s for
            # the worker side alone); what a sample costs does not depend on it
            untimed = unbuffered(dataset) if asked[0] or asked[2] else None
            if untimed is not None and asked[0]:
                # the objects the first worker side fetched are kept (once fetched: the
                # GETs it times are all made, and whole), and the others' read them and
                # take its GET figures
                got = gets["stream" if isinstance(untimed, IterableDataset) else "objects"]
                with kept_objects(kept, serve=got.cpu_s is not None):
                    per_core[key], request_s, per_sample = _worker_side(untimed, got)
                if request_s > fetch_s:
                    fetch_s, requests_per_sample = request_s, per_sample
                store = store_of(dataset)
                if store is not None and not store_rate and (keys := keys_of(dataset)):
                    # one request at a time first: what a request takes sizes the ramp's
                    measured = latency(store, keys, served=True)
                    store_latency = measured.as_dict() if measured else {}
                    store_rate = top_rate(store, keys, ramp_per_thread(measured),
                                          _enough(job, requests_per_sample))  # fmt: skip
            with kept_objects(kept):  # untimed: an object's GET once, not a structure's
                samples = _samples(untimed, batch, config) if untimed is not None else []
            if untimed is not None and asked[0]:
                collate_s[key] = _timed(lambda s=samples, c=config: _collate(c)(s))
                if trainer is None:
                    trainer = job_trainer(job, datasets.num_classes(job.dataset, dataset))
                finish_s[key] = _finish_cost(config, _collate(config)(samples), trainer)
            if dataset is not None and asked[1] and store_of(dataset) is not None:
                warm = _warm_side(job, dataset, config)
                if warm is not None:
                    cached_per_core[key] = warm
            if dataset is not None and asked[2]:
                receive_s[kind], hand_over_s[kind] = _receive_cost(samples, config)
            elif kind not in receive_s and engine_of(config).remote and beside_an_actor:
                receive_s[kind] = receive_seconds(RayDataEngine(receiver(config)).pipeline)
    finally:
        torch.set_num_threads(threads)
    return Profile(
        batch_size=batch,
        cores=cores,
        per_core=per_core,
        cached_per_core=cached_per_core,
        collate_s=collate_s,
        receive_s=receive_s,
        hand_over_s=hand_over_s,
        finish_s=finish_s,
        fetch_s=fetch_s,
        requests_per_sample=requests_per_sample,
        store_rate=store_rate,
        store_latency=store_latency,
        seconds=time.perf_counter() - started,
    )


# the ramp stops at this many times the GETs a second the step's top rate asks for
RAMP_ENOUGH = 2.0


def _enough(job: TrialJob, requests_per_sample: float) -> float:
    """GETs a second past which a store bounds no candidate: :data:`RAMP_ENOUGH` times
    what every rank at its fastest step (the ceiling: nothing trains faster) asks for;
    unbounded where no ceiling was measured. In a search on a bucket's 5 MB shards, the
    step of 16 in flight already answered 26 GETs a second, twice the 11 that the step's
    716 samples/s ask for; the step of 64 after it took 2.4 s more."""
    if not job.ceilings:
        return math.inf
    return RAMP_ENOUGH * job.ranks * max(job.ceilings.values()) * requests_per_sample


def _worker_side(dataset: Dataset[Any], gets: Gets | None = None) -> tuple[float, float, float]:
    """One core's samples/s on the worker side, the mean seconds of an object store's
    request (0 for local data), and the requests a sample takes (a GET an object; a
    stream's shards over their samples, :func:`_shard_requests`). From a store the rate
    is CPU time alone: the samples' own work, plus what a request costs the thread that
    makes it where the reading thread makes them (an object's; a shard's fetched one at
    a time), not where fetch threads do (shards read ahead; a Parquet file's always).
    The cost model adds the wait back as the candidate's requests in flight allow.
    (Wall time less the requests' time is a difference of two near-equal figures: 30 ms
    away a sample's 2 ms of decoding drowns in its 32 ms.) A stream is read in order,
    one sample at a time (:func:`_stream_side`, which takes its GET figures from
    ``gets`` where it made no GET, and fills them where it made the first); single
    objects by :data:`READERS` threads (:func:`_objects_side`, likewise)."""
    counts = count_requests(dataset)
    if counts is not None and not isinstance(dataset, IterableDataset):
        return _objects_side(dataset, counts, gets or Gets())
    if counts is None:
        read, seconds = worker_side_read(dataset, SAMPLES)
        return read / seconds, 0.0, 1.0
    return _stream_side(dataset, counts, gets or Gets())


def _stream_side(dataset: Dataset[Any], counts: Counts, gets: Gets) -> tuple[float, float, float]:
    """:func:`_worker_side` of a stream from a store, given without its shuffle buffer
    (filling it read every shard for each structure: 38 s of a 62 s profile on a
    bucket's 5 MB shards). Its requests are timed from the first, made in the warm-up
    or in the timed samples; the timed samples' CPU is their own work (the GETs this
    thread made among them taken out) plus a GET's CPU for each sample's share of a GET,
    so the figure does not depend on whether a shard's GET fell among the 32 timed
    samples (it did, or not, as they started in a shard). Where it made none (its
    shards kept by the profile), a GET's figures are the first structure's (``gets``)."""
    timed: list[tuple[float, tuple[int, float]]] = []
    before, gets_before = counts.totals(), thread_gets()
    read, _ = worker_side_read(
        dataset, SAMPLES, timing=lambda: timed.append((time.thread_time(), thread_gets()))
    )
    cpu_s, got, after = time.thread_time(), thread_gets(), counts.totals()
    requests = after["requests"] - before["requests"]
    ((cpu_started, (_, get_cpu_started)),) = timed
    work_s = cpu_s - cpu_started - (got[1] - get_cpu_started)
    shards = _shard_requests(dataset)
    per_sample = shards or 1.0  # (a stream of single objects: one each)
    if requests:
        # this thread's CPU a GET, over every GET (those fetch threads made cost it none)
        get_cpu_s = (got[1] - gets_before[1]) / requests
        request_s = (after["busy_us"] - before["busy_us"]) / 1e6 / requests
        if gets.cpu_s is None:
            gets.cpu_s, gets.request_s = get_cpu_s, request_s
    elif shards and gets.cpu_s is not None:  # every shard kept: the first structure's
        get_cpu_s, request_s = gets.cpu_s, gets.request_s
    else:  # nothing asked of the store (every sample cached): its pace alone
        return read / max(work_s, 1e-6), 0.0, per_sample
    return 1 / max(work_s / read + get_cpu_s * per_sample, 1e-9), request_s, per_sample


def _shard_requests(dataset: Dataset[Any]) -> float | None:
    """A stream's GETs a sample over an epoch: its shards over their samples (a shard's
    whole GET serves them all), at the least: a worker's or a rank's run of samples that
    starts or ends inside a shard fetches that shard too, at most two more GETs a reader
    an epoch. The timed samples alone would say 1 or 2 GETs over 32 samples, as they
    start inside a shard or at its first: twice the truth for shards of 64. None for a
    dataset of single objects."""
    for layer in wrapped(dataset):
        if isinstance(layer, ShardStream) and sum(layer.sizes):
            return len(layer.sizes) / sum(layer.sizes)
    return None


def _objects_side(dataset: Dataset[Any], counts: Counts, gets: Gets) -> tuple[float, float, float]:
    """:func:`_worker_side` of a store's single objects. A request's seconds are timed
    one at a time, as before the threads, over the warm-up's GETs after its first
    (which opens the connection); the CPU rate over the timed samples, read by
    :data:`READERS` threads that each open a connection with one GET first and then time
    their own CPU, so that their waits overlap. (Read one at a time, a variant's CPU rate
    came out within the run-to-run noise of this, 1-7% apart.)

    After the first (``gets`` filled), its reads are of the objects the profile kept,
    and its CPU is the samples' own work (any GET it still made, past the kept bytes,
    taken out by the GET's clock) plus what a GET cost the first, for each GET a sample
    took there. The first reads its timed samples again, kept, and a GET's cost is the
    difference over its GETs: all a request costs the thread, where the GET's own clock
    (:func:`thread_gets`) left 7% of a variant's CPU out; never less than that clock
    (two CPU totals' difference, under noise)."""
    samples = min(SAMPLES, len(dataset))  # type: ignore[arg-type]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a worker's
    try:
        dataset[0]  # warm the code paths and a connection
        before = counts.totals()
        for i in range(1, min(WARM_SAMPLES, samples)):
            dataset[i]
        after = counts.totals()
        cpu_s, got, get_cpu_s = _read_by_threads(dataset, samples)
        if gets.cpu_s is not None:  # the objects kept (any it fetched, past the
            # block's bytes, taken out by their clock): the first's GETs
            work_s = (cpu_s - get_cpu_s) / samples
            return 1 / (work_s + gets.cpu_s * gets.per_sample), gets.request_s, gets.per_sample
        requests = after["requests"] - before["requests"]
        request_s = (after["busy_us"] - before["busy_us"]) / 1e6 / requests if requests else 0.0
        fetched = counts.totals()["requests"] - after["requests"] - READERS  # timed samples' GETs
        per_sample = min(1.0, max(fetched, 0) / samples) or 1.0
        if got and gets.cpu_s is None:
            whole = 0.0  # outside a kept block (a worker side alone): its clock's
            with served() as kept_here:
                if kept_here:
                    kept_cpu_s, again, _ = _read_by_threads(dataset, samples)
                    whole = (cpu_s - kept_cpu_s) / got if not again else 0.0
            gets.cpu_s, gets.request_s = max(whole, get_cpu_s / got), request_s
            gets.per_sample = per_sample
    finally:
        torch.set_num_threads(threads)
    return samples / max(cpu_s, 1e-6), request_s, per_sample


def _read_by_threads(dataset: Dataset[Any], samples: int) -> tuple[float, int, float]:
    """The first ``samples`` read by :data:`READERS` threads at once, each after one read
    of its own first (a connection): their CPU-seconds, and the GETs they made and the
    CPU-seconds those took them."""
    ready = threading.Barrier(READERS)

    def read(first: int) -> tuple[float, int, float]:
        dataset[first % samples]  # this thread's connection
        ready.wait()
        started, (got, get_cpu_s) = time.thread_time(), thread_gets()
        for i in range(first, samples, READERS):
            dataset[i]
        now, (got_after, get_cpu_after) = time.thread_time(), thread_gets()
        return now - started, got_after - got, get_cpu_after - get_cpu_s

    with ThreadPoolExecutor(READERS, "raytune-profile") as pool:
        cpu_s, got, get_cpu_s = map(sum, zip(*pool.map(read, range(READERS)), strict=True))
    return cpu_s, got, get_cpu_s


def _warm_side(job: TrialJob, dataset: Dataset[Any], config: LoaderConfig) -> float | None:
    """One core's samples/s on the worker side reading a warm local cache of the objects:
    a cache of its own, holding the timed samples' objects (fetched first, all in
    flight, by :func:`~raytune_loader.measuring.measure.cold_pass`), timed in wall time
    as a local folder's is (no request is waited for). None where a timed read still
    went to the store (a cache that could not keep an object: its budget, its disk):
    that rate would not be a warm cache's."""
    filling = LoaderConfig.from_dict(
        {"fetch_threads": max(FETCH_THREADS), "cache": True, "transfer": config.transfer,
         "decode": config.decode}, batch_size=config.batch_size,
    )  # fmt: skip
    timed = Subset(dataset, range(min(SAMPLES, len(dataset))))  # type: ignore[arg-type]
    with cold_pass(replace(job, shared_cache=None), filling, timed):  # its own, these samples'
        counts = count_requests(dataset)
        rate = worker_side_rate(dataset, SAMPLES)
    return rate if counts is None or counts.totals()["requests"] == 0 else None


def receiver(config: LoaderConfig) -> LoaderConfig:
    """The Ray Data candidate the profile reads to time receiving ``config``'s batches:
    one actor of one CPU, map calls of a training batch, two batches prefetched, Ray's
    budget and blocks (what crosses, and the batch, are ``config``'s)."""
    values = {"engine": "raydata", "max_actors": 1, "cpus_per_actor": 1.0, "prefetch_batches": 2,
              "map_batch_size": config.batch_size, "transfer": config.transfer,
              "decode": config.decode}  # fmt: skip
    return LoaderConfig.from_dict(values, batch_size=config.batch_size)


def _collate(config: LoaderConfig) -> Any:
    return collate_encoded if config.decode == "device" else default_collate


def _samples(dataset: Dataset[Any], count: int, config: LoaderConfig) -> list[Any]:
    """``count`` samples of the variant, as a worker gives them to its collate."""
    if isinstance(dataset, IterableDataset):
        with opened(dataset) as items:
            return _from_stream(items, count, config)
    size = len(dataset)  # type: ignore[arg-type]
    indices = [i % size for i in range(count)]
    if store_of(dataset) is None:
        return [dataset[i] for i in indices]
    # not timed: from a store, all in flight, where one at a time each waited its GET
    # (16 at 30 ms: 0.8 s a call, 6.3 of a 24 s profile)
    with ThreadPoolExecutor(min(count, max(FETCH_THREADS)), "raytune-profile") as pool:
        return list(pool.map(dataset.__getitem__, indices))


def _from_stream(items: Any, count: int, config: LoaderConfig) -> list[Any]:
    first = next(items)
    if config.batching == "workers":  # the stream makes batches: unbatch one
        images, *rest = first
        parts = images.files() if hasattr(images, "files") else list(images)
        return [(parts[i], *(r[i] for r in rest)) for i in range(len(parts))][:count]
    return [first, *(next(items) for _ in range(count - 1))]


def _timed(action: Any, repeats: int = 5) -> float:
    """The fastest of ``repeats`` runs of ``action``, in seconds (a batch's collate, about
    a millisecond: the fastest of 3 once read 2.6 ms, its neighbour's few ms all three)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


def _finish_cost(config: LoaderConfig, batch: Any, trainer: Trainer) -> float:
    """The training process's device-side stages for one batch (decoding on the device,
    converting and normalizing uint8; nothing beyond the copy for float32), timed in
    place: each finish on its own clock, between the training steps it feeds. Timed
    alone, a uint8 batch's conversion cost 4 to 30 ms here depending on where the
    allocator took its 19 MB from; between steps it costs what a trial pays. (Steps
    with the finish less steps without read a few ms beside a 20 ms step as 0 in
    some runs: the two totals' noise is larger than the difference.)"""
    if config.decode != "device" and config.transfer == "float32":
        return 0.0

    def finished() -> Any:
        return trainer.to_device(batch, non_blocking=False, config=config)

    for _ in range(2):  # warm: kernels, decoder handles, the allocator's pools
        trainer.step(finished())

    def finishes() -> float:
        spent = 0.0
        for _ in range(BATCHES):
            trainer.sync()  # the previous step's queued work is not the finish's
            started = time.perf_counter()
            ready = finished()
            trainer.sync()
            spent += time.perf_counter() - started
            trainer.step(ready)
        return spent / BATCHES

    return min(finishes() for _ in range(ROUNDS))  # the least disturbed round


class _Ready(Dataset):
    """Samples already made: a loader over it costs only what moving batches costs."""

    def __init__(self, samples: list[Any]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples) * 64

    def __getitem__(self, index: int) -> Any:
        return self.samples[index % len(self.samples)]


def _receive_cost(samples: list[Any], config: LoaderConfig) -> tuple[float, float]:
    """(receive, hand-over) seconds per batch with one worker over ready samples.

    Receive: what the training process spends taking a batch from the worker (a
    process: unpickling it, rebuilding its tensors from shared memory; a thread: a
    queue), timed while the worker is ahead, so the wait is not counted. Hand-over:
    the worker's pace once its queue is drained, what collating the samples and
    handing the batch over costs it (a process collates into shared memory, whose
    pages are new every batch); the decoding is not in it, the samples are made."""
    prefetch = 8
    one_worker = LoaderConfig.from_dict(
        {"num_workers": 1, "prefetch_factor": prefetch, "workers": config.workers,
         "decode": config.decode, "transfer": config.transfer},
        batch_size=len(samples),
    )  # fmt: skip
    loader = build_dataloader(_Ready(samples), one_worker, seed=0)
    batches = iter(loader)
    try:
        next(batches)  # the worker is up
        time.sleep(0.5)  # and has its queue full
        receive = _paced(batches, BATCHES)
        _paced(batches, prefetch)  # what is left in the queue
        return receive, _paced(batches, BATCHES)
    finally:
        del batches, loader


def _paced(batches: Any, count: int) -> float:
    """Seconds per batch over the next ``count`` batches."""
    started = time.perf_counter()
    for _ in range(count):
        next(batches)
    return (time.perf_counter() - started) / count
