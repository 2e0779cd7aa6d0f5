"""The tuned loader over a stream, for trials and training alike.

:func:`stream_loader` (what :func:`raytune_loader.loaders.loader.build_dataloader` builds
for a stream) honours or refuses every override in one line. Its loaders,
:class:`StreamLoader` (worker processes, a DataLoader inside) and
:class:`ThreadStreamLoader`, set each pass's epoch and carry the training process's
rank to their workers; every rank reads the same number of batches of a pass
(docs/streams.md says what an epoch leaves out); ``loader.sampler.set_epoch``
reshuffles, and ``state_dict``/``load_state_dict`` resume an epoch where it stopped.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch.utils.data import (
    DataLoader,
    IterableDataset,
    default_collate,
    default_convert,
)

from raytune_loader.errors import ConfigError
from raytune_loader.loaders.batches import (
    Stamping,
    WorkerThreads,
    _pinned,
    check_resumable,
    close_at_exit,
    counted_iterator,
    timed,
)
from raytune_loader.loaders.shard_stream import ShardStream
from raytune_loader.loaders.sharding import (
    EpochClock,
    as_thread_worker,
    carry,
    placement,
    process_group,
)

if TYPE_CHECKING:
    from raytune_loader.candidates.config import LoaderConfig
log = logging.getLogger(__name__)


# The tuned loader over a stream, for trials and training alike (build_dataloader).

_THREADS_TAKE_NO = ("worker_init_fn", "generator", "multiprocessing_context", "persistent_workers")


def stream_loader(
    dataset: IterableDataset[Any],
    config: LoaderConfig,
    kwargs: dict[str, Any],
    overridden: set[str],
    *,
    drop_last: bool,
    timeout_s: float,
    stamp: bool,
    seed: int | None,
    shuffle: bool,
    samples_per_epoch: int | None,
) -> StreamLoader | ThreadStreamLoader:
    """The tuned loader over a stream: no sampler (the stream is split by rank and
    worker); batches made by the loader, or already in each worker where the stream
    batches (``batching="workers"``). Every override is honoured or refused here, in one
    line: a :class:`ShardStream` takes the loader's ``batch_size``, ``collate_fn``,
    ``drop_last``, ``num_workers``, ``seed`` and ``shuffle=False`` into its plan; a stream
    of the user's that batches itself cannot take the first two."""
    if {"sampler", "batch_sampler"} & overridden:
        raise ConfigError(
            f"{type(dataset).__name__} is a stream (an IterableDataset): it takes no sampler; "
            "it splits itself by rank and worker"
        )
    threads = config.workers == "thread"
    refused = [k for k in _THREADS_TAKE_NO if k in overridden and kwargs[k] not in (None, False)]
    if threads and refused:
        raise ConfigError(
            f"thread workers run in the training process and take no {', '.join(refused)}: "
            "leave it out, or use a configuration with worker processes"
        )
    batch_size, collate = kwargs["batch_size"], kwargs.get("collate_fn")
    workers = kwargs["num_workers"]
    if isinstance(dataset, ShardStream):
        stream: Any = dataset.for_loader(
            batch_size=batch_size, collate=collate, drop_last=drop_last, workers=workers,
            seed=seed, shuffle=shuffle,
        )  # fmt: skip
        in_workers = stream.batched_in_workers
        stream.fetch_threads = config.fetch_threads  # shards fetched ahead, from a store
    else:
        stream = dataset
        in_workers = config.batching == "workers" or getattr(dataset, "batched_in_workers", False)
        mine = sorted({"batch_size", "collate_fn"} & overridden)
        if in_workers and mine:
            raise ConfigError(
                f"{type(dataset).__name__} makes its batches itself: it cannot take the "
                f"loader's {' and '.join(mine)}; set them where the stream batches"
            )
    loader_batch = None if in_workers else batch_size
    loader_collate = None if in_workers else collate
    if stamp:  # each made batch stamped; a ready one converted as DataLoader would
        loader_collate = Stamping(
            loader_collate or (default_collate if loader_batch else default_convert)
        )
        stream = timed(stream)
    shape = _Shape(batch_size, in_workers, drop_last, samples_per_epoch)
    if threads:
        return ThreadStreamLoader(
            stream, loader_batch, loader_collate or default_collate, workers,
            kwargs.get("prefetch_factor") or 2, kwargs["in_order"], kwargs["pin_memory"],
            drop_last, timeout=timeout_s, shape=shape,
        )  # fmt: skip
    options = {
        k: v for k, v in kwargs.items()
        if k not in ("sampler", "batch_size", "collate_fn", "worker_init_fn", "num_workers")
    }  # fmt: skip
    return StreamLoader(
        stream, batch_size=loader_batch, collate_fn=loader_collate, num_workers=workers,
        drop_last=drop_last, timeout=timeout_s, worker_threads=config.worker_threads,
        worker_init_fn=kwargs.get("worker_init_fn"), shape=shape, **options,
    )  # fmt: skip


@dataclass(frozen=True)
class _Shape:
    """What a pass of a stream of the user's is cut to (see :meth:`_Passes.limit`)."""

    batch_size: int | None
    in_workers: bool
    drop_last: bool
    samples_per_epoch: int | None


def _planned(dataset: Any) -> ShardStream | None:
    """The :class:`ShardStream` a loader reads (inside a measurement's timing wrapper)."""
    if isinstance(dataset, ShardStream):
        return dataset
    inner = getattr(dataset, "dataset", None)
    return inner if isinstance(inner, ShardStream) else None


class _Passes:
    """What both stream loaders share: each pass's epoch and rank, the batches every rank
    reads in it, and the state a resumed pass starts from.

    A :class:`ShardStream` is planned: every rank reads the same number of batches, and
    a resumed pass skips, worker by worker, the batches read before. A stream of the
    user's cannot be planned: in a process group of more than one rank every pass is
    cut at the same number of batches on every rank (``samples_per_epoch``, or the
    stream's ``len``: samples per rank), each worker's stream repeating where it runs
    out, as webdataset's ``with_epoch`` recipe does; a resumed pass drops the batches
    read before. ``set_epoch`` reaches the user's stream where it has one."""

    dataset: Any
    num_workers: int
    batch_size: int | None

    def _setup(self, dataset: Any, shape: _Shape) -> None:
        self.dataset = dataset
        self._shape = shape
        self._stream = _planned(dataset)
        self.clock: EpochClock = self._stream.clock if self._stream else EpochClock()
        self.sampler = StreamEpochs(self)  # what trainers call set_epoch on
        self._limit: int | None = None
        self._delivered = 0
        self._discard = 0
        world = process_group()[1]  # what can be refused now is, in one line
        if self._stream is not None:
            self._stream.batches_per_rank(world)
        else:
            self.limit(world)

    def _workers(self) -> int:
        return max(1, self.num_workers)

    def begin(self) -> tuple[int, int]:
        """A pass starts: its epoch and skips set, its cut known; (rank, world)."""
        rank, world = process_group()
        if self._stream is not None:
            self._stream.batches_per_rank(world)  # refused in one line
            epoch, skips = self.clock.begin(self._workers())
            self._stream.start_pass(epoch, skips)
            self._limit, self._discard = None, 0
        else:
            self._limit = self.limit(world)
            epoch, skips = self.clock.begin(1)
            self._discard = skips[0]
            _forward_epoch(self.dataset, epoch)
        self._delivered = 0
        return rank, world

    def limit(self, world: int) -> int | None:
        """Batches every rank reads of a user's stream: None with one rank."""
        if world == 1:
            return None
        shape = self._shape
        items = shape.samples_per_epoch
        if items is None:
            try:
                items = len(self.dataset)
            except TypeError:
                raise ConfigError(
                    f"{type(self.dataset).__name__} is a stream of your own without a length, "
                    f"read by {world} ranks: every rank must read as many batches; give it "
                    "__len__ (samples per rank) or pass samples_per_epoch="
                ) from None
            if shape.in_workers:
                return items  # its items are batches
        size = shape.batch_size or 1
        return items // size if shape.drop_last else -(-items // size)

    def exhausted(self) -> bool:
        return self._limit is not None and self._delivered >= self._limit

    def delivered(self, worker: int, index: int = 0) -> bool:
        if self._discard > 0:  # a resumed pass of a user's stream: read before
            self._discard -= 1
            return False
        self._delivered += 1
        self.clock.took(worker if self._stream is not None else 0)
        return True

    def ended(self) -> None:
        self.clock.end()

    def set_epoch(self, epoch: int) -> None:
        self.clock.set_epoch(epoch)  # the next pass takes it (begin)
        if self._stream is None:
            _forward_epoch(self.dataset, epoch)

    def __len__(self) -> int:
        """Batches this rank reads in an epoch (every rank the same)."""
        world = process_group()[1]
        if self._stream is not None:
            if self._stream.repeat:
                raise TypeError("a trial's stream repeats without end: it has no length")
            return self._stream.batches_per_rank(world)
        limit = self.limit(world)
        if limit is None:
            raise TypeError(f"{type(self.dataset).__name__} has no length on one rank")
        return limit

    def state_dict(self) -> dict[str, Any]:
        """The epoch being read and the batches each worker delivered (the whole pass's
        for a user's stream), with what they depend on."""
        return {
            **self.clock.state_dict(), "world": process_group()[1],
            "batch_size": self.batch_size, "workers": self._workers(),
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next pass of the saved epoch skips the batches read before."""
        workers = self._workers() if self._stream is not None else state.get("workers")
        check_resumable(state, batch_size=self.batch_size, workers=workers)
        self.clock.load_state_dict(state)


def _forward_epoch(dataset: Any, epoch: int) -> None:
    set_epoch = getattr(dataset, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


class StreamEpochs:
    """A stream loader's ``sampler``: nothing to sample, but where Lightning, Ray Train's
    loop and a DDP loop call ``set_epoch`` (``len`` is the samples this rank reads)."""

    def __init__(self, passes: _Passes) -> None:
        self._passes = passes

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle the stream for ``epoch`` (``loader.sampler.set_epoch``, as trainers call
        it)."""
        self._passes.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next pass reads."""
        return self._passes.clock.epoch

    def state_dict(self) -> dict[str, Any]:
        """Where the stream's epoch is, to resume it."""
        return self._passes.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the stream's epoch from :meth:`state_dict`."""
        self._passes.load_state_dict(state)

    def __len__(self) -> int:
        passes = self._passes
        world = process_group()[1]
        if passes._stream is not None:
            return passes._stream.samples_per_rank(world)
        return len(passes) * (passes.batch_size or 1)


@dataclass(frozen=True)
class StreamWorkerInit:
    """A stream loader's ``worker_init_fn``: the rank the training process read, carried
    to the worker (:func:`raytune_loader.loaders.sharding.carry`) whatever started it; then
    ``worker_threads``; then the user's own, or Lightning's seeding. Picklable."""

    rank: int
    world: int
    threads: int | None
    then: Callable[[int], None] | None

    def __call__(self, worker_id: int) -> None:
        carry(self.rank, self.world)
        if self.threads is not None:
            WorkerThreads(self.threads, self.then, self.rank)(worker_id)
        elif self.then is not None:
            self.then(worker_id)


class _PassLoader(DataLoader):  # type: ignore[type-arg]
    """The DataLoader inside a :class:`StreamLoader`: its iterator reports each batch."""

    passes: _Passes

    def _get_iterator(self) -> Any:
        return counted_iterator(self)


class StreamLoader(_Passes):
    """The tuned loader over a stream with worker processes: a DataLoader inside, each
    pass's epoch and rank set before it starts. Not a DataLoader itself, so
    accelerate's ``prepare`` passes it through (it would split the stream's batches
    across ranks again, or read them on rank 0 only) and Lightning and Ray Train keep
    it; it has a DataLoader's attributes for them. ``worker_init_fn`` (Lightning's
    seeding, the user's) runs in each worker after the tool's own."""

    def __init__(
        self,
        dataset: IterableDataset[Any],
        *,
        batch_size: int | None,
        collate_fn: Callable[[list[Any]], Any] | None,
        num_workers: int,
        drop_last: bool,
        timeout: float,
        worker_threads: int | None,
        worker_init_fn: Callable[[int], None] | None,
        shape: _Shape,
        **options: Any,
    ) -> None:
        if _planned(dataset) is None:
            dataset = _Endless(dataset)  # a user's stream, cut by the loader
        self._loader = _PassLoader(
            dataset, batch_size=batch_size, collate_fn=collate_fn, num_workers=num_workers,
            drop_last=drop_last and batch_size is not None, timeout=timeout, **options,
        )  # fmt: skip
        self._loader.passes = self
        self._setup(dataset, shape)
        self.batch_size, self.drop_last, self.num_workers = batch_size, drop_last, num_workers
        self.collate_fn, self.timeout = collate_fn, timeout
        for name in ("prefetch_factor", "pin_memory", "persistent_workers", "in_order",
                     "multiprocessing_context", "generator"):  # fmt: skip
            setattr(self, name, getattr(self._loader, name))
        self.worker_init_fn = worker_init_fn
        self._threads = worker_threads

    def __iter__(self) -> Any:
        rank, world = self.begin()
        if self.num_workers > 0:
            self._loader.worker_init_fn = StreamWorkerInit(
                rank, world, self._threads, self.worker_init_fn
            )
        return iter(self._loader)  # the DataLoader's own iterator: its workers can be seen

    @property
    def _iterator(self) -> Any:  # persistent workers' iterator, as a DataLoader keeps it
        return self._loader._iterator

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        self._loader._iterator = value


class _Endless(IterableDataset):  # type: ignore[type-arg]
    """A user's stream over and over in each worker, so a pass cut at the same number of
    batches on every rank never runs short; a stream that yields nothing ends. Only
    used in a process group of more than one rank; one rank reads a pass as it is."""

    def __init__(self, stream: IterableDataset[Any]) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[Any]:
        if placement()[1] == 1:
            yield from self.stream
            return
        while True:
            produced = False
            for item in self.stream:
                produced = True
                yield item
            if not produced:
                return

    def __len__(self) -> int:
        return len(self.stream)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "stream":
            raise AttributeError(name)  # while unpickling, before it is set
        return getattr(self.stream, name)


class ThreadStreamLoader(_Passes):
    """Batches of a stream (an IterableDataset) from ``num_workers`` threads.

    Each thread iterates the stream as thread worker i of n of this rank
    (:func:`~raytune_loader.loaders.sharding.as_thread_worker`), so a stream that splits by
    :func:`~raytune_loader.loaders.sharding.worker_share` gives each thread its own share, and
    makes whole batches (or takes the stream's own). Up to ``prefetch_factor`` batches
    wait per thread. In order, batches come round-robin from the threads, as a
    DataLoader's workers' do; otherwise as they are ready. A thread's error reaches the
    loop with its type and message; a batch that takes longer than ``timeout`` seconds
    fails it as DataLoader's would; every thread is stopped when an epoch ends, fails
    or is abandoned. Without workers the stream is read in the loop's own thread."""

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
        *,
        timeout: float = 0.0,
        shape: _Shape | None = None,
    ) -> None:
        shape = shape or _Shape(batch_size, batch_size is None, drop_last, None)
        self._setup(dataset, shape)
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.in_order = in_order
        self.pin_memory = pin_memory
        self.drop_last = drop_last
        self.timeout = timeout

    def __iter__(self) -> Iterator[Any]:
        return close_at_exit(self._epoch())

    def _epoch(self) -> Generator[Any, None, None]:
        placement = self.begin()
        with contextlib.closing(self._items(placement)) as items:  # its threads stop here
            for worker, item in items:
                if self.exhausted():
                    break
                if self.delivered(worker):
                    yield item
        self.ended()  # read to its end (an abandoned pass is not)

    def _items(self, placement: tuple[int, int]) -> Iterator[tuple[int, Any]]:
        if self.num_workers == 0:
            for item in self._made(iter(self._source())):
                yield 0, item
            return
        stop = threading.Event()
        shared: queue.Queue[Any] = queue.Queue(self.prefetch_factor * self.num_workers)
        queues = [
            queue.Queue(self.prefetch_factor) if self.in_order else shared
            for _ in range(self.num_workers)
        ]
        threads = [
            threading.Thread(target=self._work, args=(i, queues[i], stop, placement),
                             daemon=True, name=f"raytune-stream-{i}")
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

    def _source(self) -> Any:
        return self.dataset if self._stream is not None else _Endless(self.dataset)

    def _get(self, out: queue.Queue[Any]) -> Any:
        try:
            return out.get(timeout=self.timeout or None)
        except queue.Empty:
            raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds") from None

    def _ordered(self, queues: list[queue.Queue[Any]]) -> Iterator[tuple[int, Any]]:
        live = list(range(self.num_workers))
        while live:
            for worker in list(live):
                item = self._get(queues[worker])
                if item is _DONE:
                    live.remove(worker)
                    continue
                yield _raised(item)

    def _ready(self, shared: queue.Queue[Any]) -> Iterator[tuple[int, Any]]:
        done = 0
        while done < self.num_workers:
            item = self._get(shared)
            if item is _DONE:
                done += 1
                continue
            yield _raised(item)

    def _made(self, samples: Iterator[Any]) -> Iterator[Any]:
        """Batches from one worker's samples: made here, or the stream's own."""
        pending: list[Any] = []
        for sample in samples:
            if self.batch_size is not None:
                pending.append(sample)
                if len(pending) < self.batch_size:
                    continue
                sample, pending = self.collate_fn(pending), []
            elif isinstance(self.collate_fn, Stamping):  # a ready batch, measured
                sample = self.collate_fn(sample)
            yield _pinned(sample) if self.pin_memory else sample
        if pending and not self.drop_last:
            last = self.collate_fn(pending)
            yield _pinned(last) if self.pin_memory else last

    def _work(
        self, worker: int, out: queue.Queue[Any], stop: threading.Event,
        placement: tuple[int, int],
    ) -> None:  # fmt: skip
        try:
            with as_thread_worker(worker, self.num_workers, placement):
                for batch in self._made(iter(self._source())):
                    if stop.is_set():
                        return
                    _put(out, (worker, batch), stop)
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
