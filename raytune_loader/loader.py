"""The one place a loader is built from a :class:`LoaderConfig`.

Trials, the verification step, the bench and users' training code (through
``load_best_config(...).dataloader(dataset)``) all call :func:`build_dataloader`,
so what was measured is what users get. Worker processes are PyTorch's
``DataLoader``; thread workers are ``torchdata.nodes`` (PyTorch's maintained
node-based loader): each thread builds whole batches, as a DataLoader worker does,
so ``num_workers``, ``prefetch_factor`` and ``in_order`` mean the same in both. A
stream (an IterableDataset) gets a DataLoader without a sampler, or
:class:`ThreadStreamLoader`'s plain threads, each a worker of the stream's split.
Worker processes with ``worker_threads`` set start with :class:`WorkerThreads` as
their ``worker_init_fn``: the thread pools of BLAS, OpenMP and torch held to that
many threads in each.

In a process group both read their own rank's shard of every epoch
(:mod:`raytune_loader.sharding`), so a trainer that keeps the loader (Lightning,
Ray Train, a DDP loop) or rebuilds it from its arguments (accelerate) runs the tuned
settings on the right samples; the rank measurements of ``--ranks-per-node`` build
their loaders the same way, after :func:`use_platform_start_method` (a rank is a
forkserver's child; its loaders start their workers as a torchrun rank's do).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    default_collate,
    default_convert,
)
from torch.utils.data.distributed import DistributedSampler

from raytune_loader.errors import ConfigError
from raytune_loader.pipeline import collate_encoded
from raytune_loader.sharding import RankBatches, ShardSampler, as_thread_worker, process_group
from raytune_loader.space import LoaderConfig


def build_dataloader(
    dataset: Dataset[Any],
    config: LoaderConfig,
    *,
    shuffle: bool = True,
    drop_last: bool = True,
    timeout_s: float = 0.0,
    seed: int | None = None,
    samples_per_epoch: int | None = None,
    stamp: bool = False,
    **overrides: Any,
) -> TunedDataLoader | ThreadLoader | DataLoader[Any] | ThreadStreamLoader:
    """The tuned loader over ``dataset``; ``overrides`` (DataLoader arguments) win over
    the config. Thread workers take ``sampler`` and ``collate_fn`` among them.

    Without a ``sampler`` override the loader shards itself in a process group: each rank
    reads its own share of every epoch (:mod:`raytune_loader.sharding`), whoever iterates
    it. ``samples_per_epoch`` (per rank) makes an epoch longer or shorter than the data.
    ``stamp`` (measurements only) yields every batch as a :class:`Stamped`: which worker
    made it and when it was done.
    """
    kwargs: dict[str, Any] = config.kwargs()
    if config.num_workers == 0:
        for key in ("prefetch_factor", "persistent_workers", "multiprocessing_context"):
            kwargs.pop(key)  # DataLoader accepts them only with workers
        timeout_s = 0.0  # DataLoader only accepts a timeout with workers
    if config.pin_memory and not torch.cuda.is_available():
        kwargs["pin_memory"] = False  # pinning needs an accelerator; it would only warn
    if config.decode == "device":
        kwargs["collate_fn"] = collate_encoded  # JPEGs of different lengths stay a list
    kwargs.update(overrides)
    if config.worker_threads is not None:  # worker processes only (LoaderConfig checks)
        then = kwargs.get("worker_init_fn")  # the user's own runs after ours
        kwargs["worker_init_fn"] = WorkerThreads(config.worker_threads, then)
    if stamp:
        dataset = timed(dataset)
    if isinstance(dataset, IterableDataset):
        return _stream_loader(
            dataset, config, kwargs, set(overrides), drop_last, timeout_s, stamp
        )  # fmt: skip
    if stamp:
        kwargs["collate_fn"] = Stamping(kwargs.get("collate_fn") or default_collate)
    _refuse_unsupported(config, kwargs.get("sampler"))
    if "batch_sampler" in kwargs:
        raise ConfigError(
            "the tuned loader makes its own batches (batch_size is tuned): "
            "pass sampler=, not batch_sampler="
        )
    if kwargs.get("sampler") is None:
        kwargs["sampler"] = ShardSampler(
            dataset,
            shuffle=shuffle,
            seed=seed or 0,
            samples=samples_per_epoch,  # type: ignore[arg-type]
        )
    if config.workers == "thread":
        unsupported = set(overrides) - {"sampler", "collate_fn", *config.kwargs()}
        if unsupported:
            raise ConfigError(
                f"thread workers take sampler and collate_fn, not {', '.join(sorted(unsupported))}"
            )
        return ThreadLoader(
            dataset, BatchSampler(kwargs["sampler"], kwargs["batch_size"], drop_last),
            kwargs.get("collate_fn") or default_collate, config.num_workers,
            kwargs["prefetch_factor"] or 2, kwargs["in_order"], kwargs["pin_memory"],
        )  # fmt: skip
    return TunedDataLoader(dataset, drop_last=drop_last, timeout=timeout_s, **kwargs)


@dataclass(frozen=True)
class Stamped:
    """A batch as a measurement reads it, with when its worker started and finished
    making it (``time.monotonic``, one clock for every process of a host): the worker's
    own time for it, whatever stock the loader holds and however long the worker
    waited for a task before. :mod:`raytune_loader.steady` turns them into the rate
    the workers produce at."""

    batch: Any
    started: float
    made: float

    def pin_memory(self) -> Stamped:  # DataLoader's pin thread and torchdata's call it
        return Stamped(_pinned(self.batch), self.started, self.made)


_making = threading.local()  # this worker's batch in the making: when its first read began


def _reading() -> None:
    """A sample is about to be read: the worker's batch starts now, unless it has."""
    if getattr(_making, "started", None) is None:
        _making.started = time.monotonic()


class Stamping:
    """A collate function that stamps what ``collate`` makes (picklable, so spawn and
    forkserver workers get it); the datasets :func:`timed` wraps say when reading began."""

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate

    def __call__(self, items: Any) -> Stamped:
        batch = self.collate(items)
        made = time.monotonic()
        started = getattr(_making, "started", None)
        _making.started = None
        return Stamped(batch, made if started is None else started, made)


class _TimedMap(Dataset):  # type: ignore[type-arg]
    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        _reading()
        return self.dataset[index]


class _TimedStream(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, dataset: IterableDataset[Any]) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[Any]:
        items = iter(self.dataset)
        while True:
            _reading()
            try:
                item = next(items)
            except StopIteration:
                return
            yield item

    def __getattr__(self, name: str) -> Any:  # the stream's own attributes, as before
        if name == "dataset":
            raise AttributeError(name)  # while unpickling, before it is set
        return getattr(self.dataset, name)


def timed(dataset: Dataset[Any]) -> Dataset[Any]:
    """``dataset`` saying when each batch's first read begins, for :class:`Stamping`."""
    if isinstance(dataset, IterableDataset):
        return _TimedStream(dataset)
    return _TimedMap(dataset)


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class WorkerThreads:
    """The tuned ``worker_init_fn`` of ``worker_threads``: in each worker process, the
    thread pools of the BLAS and OpenMP libraries loaded there (through threadpoolctl)
    and torch's intra-op pool held to ``threads``, and the variables those libraries
    read when they load set, for one a transform imports later; then the user's own
    ``worker_init_fn``, if any. A worker otherwise keeps what it inherited: a pool per
    library the size of the node (or of Ray's reservation), one per worker, all
    competing for the same cores. Picklable, so spawn and forkserver workers get it."""

    def __init__(self, threads: int, then: Callable[[int], None] | None = None) -> None:
        self.threads = threads
        self.then = then

    def __call__(self, worker_id: int) -> None:
        from threadpoolctl import threadpool_limits

        for name in THREAD_VARIABLES:
            os.environ[name] = str(self.threads)
        threadpool_limits(limits=self.threads)  # as a call, the limits stay in force
        torch.set_num_threads(self.threads)
        if self.then is not None:
            self.then(worker_id)

    def __repr__(self) -> str:
        return f"WorkerThreads({self.threads}, then={self.then!r})"


def _refuse_unsupported(config: LoaderConfig, sampler: Any) -> None:
    """Refuse now, in one line, what would fail or silently duplicate data later."""
    world = process_group()[1]
    if (
        config.workers == "thread"
        and world > 1
        and sampler is not None
        and not isinstance(sampler, DistributedSampler)
    ):
        raise ConfigError(
            f"thread workers read what the sampler gives, and {type(sampler).__name__} "
            f"gives every one of the {world} ranks the same samples: pass a "
            "DistributedSampler, or no sampler (the tuned loader then shards itself)"
        )


def _stream_loader(
    dataset: IterableDataset[Any],
    config: LoaderConfig,
    kwargs: dict[str, Any],
    overridden: set[str],
    drop_last: bool,
    timeout_s: float,
    stamp: bool = False,
) -> DataLoader[Any] | ThreadStreamLoader:
    """The tuned loader over a stream: no sampler (the stream splits itself by rank and
    worker); batches made by the loader, or already by the stream's pipeline in each
    worker (``batching="workers"``: DataLoader ``batch_size=None``)."""
    if {"sampler", "batch_sampler"} & overridden:
        raise ConfigError(
            f"{type(dataset).__name__} is a stream (an IterableDataset): it takes no sampler; "
            "it splits itself by rank and worker"
        )
    batch_size = None if config.batching == "workers" else kwargs["batch_size"]
    collate = kwargs.get("collate_fn") if batch_size is not None else None
    if stamp:  # each made batch stamped; a ready one converted as DataLoader would
        collate = Stamping(collate or (default_collate if batch_size else default_convert))
    if config.workers == "thread":
        return ThreadStreamLoader(
            dataset, batch_size, collate or default_collate, config.num_workers,
            kwargs["prefetch_factor"] or 2, kwargs["in_order"], kwargs["pin_memory"], drop_last,
        )  # fmt: skip
    options = {k: v for k, v in kwargs.items() if k not in ("sampler", "batch_size", "collate_fn")}
    return DataLoader(
        dataset, batch_size=batch_size, drop_last=drop_last and batch_size is not None,
        collate_fn=collate, timeout=timeout_s, **options,
    )  # fmt: skip


class TunedDataLoader(DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` that reads its own rank's shard when it runs in a process group.

    Its constructor is DataLoader's, so trainers that rebuild a loader from its
    arguments (Lightning) rebuild it with the tuned ones. Only its own iteration is
    sharded by rank (:class:`~raytune_loader.sharding.RankBatches`); its
    ``batch_sampler`` yields whole epochs, for trainers that split batches themselves.
    """

    @property
    def _index_sampler(self) -> Any:
        index_sampler = super()._index_sampler
        if isinstance(index_sampler, BatchSampler):
            return RankBatches(index_sampler)
        return index_sampler


class ThreadLoader:
    """Batches from ``num_workers`` threads (``torchdata.nodes``): each thread reads
    and collates a whole batch; up to ``prefetch_factor`` x ``num_workers`` batches
    wait ready. Iterating again starts a new epoch, like a DataLoader. Decoding and
    the tensor transforms release the GIL; a Python-heavy ``__getitem__`` does not.

    It has a DataLoader's attributes (``dataset``, ``sampler``, ``batch_sampler``,
    ``batch_size``, ``num_workers``...) so trainers find its sampler (to call
    ``set_epoch``) and see that it is already sharded; no trainer rebuilds it."""

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_sampler: BatchSampler,
        collate_fn: Callable[[list[Any]], Any],
        num_workers: int,
        prefetch_factor: int,
        in_order: bool,
        pin_memory: bool,
    ) -> None:
        import torchdata.nodes as tn

        def batch(indices: Sequence[int]) -> Any:
            return collate_fn([dataset[i] for i in indices])

        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.sampler = batch_sampler.sampler
        self.batch_size = batch_sampler.batch_size
        self.drop_last = batch_sampler.drop_last
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.in_order = in_order
        self.pin_memory = pin_memory
        self._batches = RankBatches(batch_sampler)
        node: Any = tn.ParallelMapper(
            tn.SamplerWrapper(self._batches),  # type: ignore[arg-type]
            map_fn=batch,
            num_workers=num_workers,
            method="thread",
            in_order=in_order,
            max_concurrent=num_workers,
        )
        if pin_memory:
            node = tn.PinMemory(node)
        self._loader = tn.Loader(tn.Prefetcher(node, prefetch_factor * num_workers))

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._loader
        finally:  # an epoch ended, failed or was abandoned: its threads stop, here
            _stop_threads(self._loader)

    def __len__(self) -> int:
        return len(self._batches)


class ThreadStreamLoader:
    """Batches of a stream (an IterableDataset) from ``num_workers`` threads.

    Each thread iterates the stream as thread worker i of n
    (:func:`~raytune_loader.sharding.as_thread_worker`), so a stream that splits its
    shards by :func:`~raytune_loader.sharding.worker_share` gives each thread its own
    share, and makes whole batches (or takes the stream's own). Up to
    ``prefetch_factor`` batches wait per thread. In order, batches come round-robin
    from the threads, as a DataLoader's workers' do; otherwise as they are ready. A
    thread's error reaches the loop with its type and message; every thread is stopped
    when an epoch ends, fails or is abandoned."""

    def __init__(
        self,
        dataset: IterableDataset[Any],
        batch_size: int | None,
        collate_fn: Callable[[list[Any]], Any],
        num_workers: int,
        prefetch_factor: int,
        in_order: bool,
        pin_memory: bool,
        drop_last: bool,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.in_order = in_order
        self.pin_memory = pin_memory
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[Any]:
        stop = threading.Event()
        shared: queue.Queue[Any] = queue.Queue(self.prefetch_factor * self.num_workers)
        queues = [
            queue.Queue(self.prefetch_factor) if self.in_order else shared
            for _ in range(self.num_workers)
        ]
        threads = [
            threading.Thread(target=self._work, args=(i, queues[i], stop), daemon=True,
                             name=f"raytune-stream-{i}")
            for i in range(self.num_workers)
        ]  # fmt: skip
        for thread in threads:
            thread.start()
        try:
            yield from self._ordered(queues) if self.in_order else self._ready(shared)
        finally:
            stop.set()
            for out in {id(q): q for q in queues}.values():
                _drain(out)  # a thread waiting to put sees the stop
            deadline = time.monotonic() + 60  # one stuck in the stream's own read: a daemon
            for thread in threads:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _ordered(self, queues: list[queue.Queue[Any]]) -> Iterator[Any]:
        live = list(range(self.num_workers))
        while live:
            for worker in list(live):
                item = queues[worker].get()
                if item is _DONE:
                    live.remove(worker)
                    continue
                yield _raised(item)

    def _ready(self, shared: queue.Queue[Any]) -> Iterator[Any]:
        done = 0
        while done < self.num_workers:
            item = shared.get()
            if item is _DONE:
                done += 1
                continue
            yield _raised(item)

    def _work(self, worker: int, out: queue.Queue[Any], stop: threading.Event) -> None:
        try:
            with as_thread_worker(worker, self.num_workers):
                pending: list[Any] = []
                for sample in self.dataset:
                    if stop.is_set():
                        return
                    if self.batch_size is not None:
                        pending.append(sample)
                        if len(pending) < self.batch_size:
                            continue
                        sample, pending = self.collate_fn(pending), []
                    elif isinstance(self.collate_fn, Stamping):  # a ready batch, measured
                        sample = self.collate_fn(sample)
                    _put(out, _pinned(sample) if self.pin_memory else sample, stop)
                if pending and not self.drop_last:
                    last = self.collate_fn(pending)
                    _put(out, _pinned(last) if self.pin_memory else last, stop)
        except Exception as exc:  # noqa: BLE001 - the loop raises it, with its type
            _put(out, _Failure(exc), stop)
        finally:
            _put(out, _DONE, stop)


_DONE = object()


@dataclass(frozen=True)
class _Failure:
    error: Exception


def _raised(item: Any) -> Any:
    if isinstance(item, _Failure):
        raise item.error
    return item


def _put(out: queue.Queue[Any], item: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


def _drain(out: queue.Queue[Any]) -> None:
    while True:
        try:
            out.get_nowait()
        except queue.Empty:
            return


def _pinned(batch: Any) -> Any:
    """``batch`` in pinned host memory (tensors at any depth, or objects that pin)."""
    if isinstance(batch, torch.Tensor) or hasattr(batch, "pin_memory"):
        return batch.pin_memory()
    if isinstance(batch, (list, tuple)):
        return type(batch)(_pinned(item) for item in batch)
    if isinstance(batch, dict):
        return {k: _pinned(v) for k, v in batch.items()}
    return batch


def _stop_threads(node: Any, seen: set[int] | None = None) -> None:
    """Stop the threads of a torchdata node tree now, from this thread.

    torchdata.nodes 0.11 has no public shutdown: an abandoned epoch's threads end when
    its iterators are garbage-collected, which may happen in one of those threads
    ("cannot join current thread", printed in the user's training loop). Its iterators'
    own ``_shutdown`` (what their ``__del__`` calls) is called outer node first; a
    later torchdata without it leaves the threads to the garbage collector as before.
    """
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
    stop = getattr(node, "_shutdown", None)
    if callable(stop):
        stop()
    for name in ("root", "_it", "source"):
        child = getattr(node, name, None)
        if child is not None:
            _stop_threads(child, seen)


def use_platform_start_method() -> None:
    """Make the platform's start method this process's default, as it is in a process
    that torchrun or a shell starts. A spawned or forkserver child takes its parent's
    method as its own default, so a loader built there with the default start method
    would start every worker that way, each importing torch (7.5 s to a first batch
    on 2 cores, against 0.17 s forked: results/benchmarks/ranks_overhead.md)."""
    multiprocessing.set_start_method(None, force=True)
