"""What every tuned loader shares, worker processes, threads or streams.

:class:`Stamped` and :class:`Stamping`: the stamps a measurement reads on each batch
(when its worker began reading it and when it was done, for
:mod:`raytune_loader.measuring.steady`), with :func:`timed` marking where a batch's first read
begins. :class:`WorkerThreads`: the ``worker_init_fn`` that holds each worker
process's thread pools. :func:`counted_iterator`, the sampler's state and
:func:`check_resumable`: counting the batches an epoch delivered, so a resumed run
picks the epoch up where it stopped. :func:`close_at_exit`: a thread loader's epoch
left open when the program ends stops its threads first. :func:`_pinned`: pinning a
batch at any depth.
:mod:`raytune_loader.loaders.loader` and :mod:`raytune_loader.streams` build their loaders
from these.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data.dataloader import (
    _MultiProcessingDataLoaderIter,
    _SingleProcessDataLoaderIter,
)

from raytune_loader.errors import ConfigError
from raytune_loader.loaders.sharding import ShardSampler, process_group
from raytune_loader.wrapped import wrapped


@dataclass(frozen=True)
class Stamped:
    """A batch as a measurement reads it, with when its worker started and finished
    making it (``time.monotonic``, one clock for every process of a host): the worker's
    own time for it, whatever stock the loader holds and however long the worker
    waited for a task before. :mod:`raytune_loader.measuring.steady` turns them into the rate
    the workers produce at."""

    batch: Any
    started: float
    made: float

    def pin_memory(self) -> Stamped:  # DataLoader's pin thread and torchdata's call it
        """The batch pinned, the stamps kept (DataLoader's pin thread and torchdata's call it)."""
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

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        _reading()
        return fetch_batch(self.dataset, indices)


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


def fetch_batch(dataset: Dataset[Any], indices: Sequence[int]) -> list[Any]:
    """A batch's samples, as a DataLoader worker fetches them: in one call where the
    dataset has ``__getitems__`` (a remote dataset's objects fetched together, a
    ``Subset`` passing it on), else one index at a time."""
    many = getattr(dataset, "__getitems__", None)
    if many is not None:
        return list(many(list(indices)))
    return [dataset[i] for i in indices]


def set_fetch_threads(dataset: Dataset[Any], threads: int) -> None:
    """Give ``threads`` to the dataset under ``dataset``'s wrappers (``Subset``, the
    measurement's) that fetches a batch's objects with that many at once: a remote
    dataset's ``fetch_threads``; a dataset without one is left as it is."""
    layer = _fetching(dataset)
    if layer is not None:
        layer.fetch_threads = threads


def fetch_threads_of(dataset: Dataset[Any]) -> int | None:
    """The requests in flight of the dataset under ``dataset``'s wrappers that fetches a
    batch's objects (:func:`set_fetch_threads`); None for one that fetches nothing."""
    layer = _fetching(dataset)
    return None if layer is None else int(layer.fetch_threads)


def _fetching(dataset: Dataset[Any]) -> Any:
    return next((layer for layer in wrapped(dataset) if "fetch_threads" in vars(layer)), None)


def set_cached(dataset: Dataset[Any], on: bool, cache: Any = None) -> None:
    """Turn the local object cache of the dataset under ``dataset``'s wrappers on (in
    ``cache``, else one it was given, else its default) or off: a remote dataset's
    ``keep_objects``; a dataset without one is left as it is."""
    for layer in wrapped(dataset):
        keep = getattr(layer, "keep_objects", None)
        if callable(keep):
            keep(on, cache)
            return


def timed(dataset: Dataset[Any]) -> Dataset[Any]:
    """``dataset`` saying when each batch's first read begins, for :class:`Stamping`."""
    if isinstance(dataset, IterableDataset):
        return _TimedStream(dataset)
    return _TimedMap(dataset)


_OPEN_EPOCHS: weakref.WeakSet[Generator[Any, None, None]] = weakref.WeakSet()


def close_at_exit(epoch: Generator[Any, None, None]) -> Generator[Any, None, None]:
    """``epoch`` (a thread loader's pass), closed when the program ends if it is still
    open. A loop that stops before the epoch's end (``for step, batch in ...: if step
    == n: break``) leaves it suspended, and the interpreter otherwise finalizes it after
    tearing modules down: its threads, still reading, then stop with a traceback at exit
    or abort the process. Closed here, its ``finally`` stops them while all is intact."""
    _OPEN_EPOCHS.add(epoch)
    return epoch


@atexit.register
def _close_open_epochs() -> None:
    for epoch in list(_OPEN_EPOCHS):
        # one another thread is reading at exit (close() raises ValueError) is its to end
        with contextlib.suppress(ValueError):
            epoch.close()


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _training_rank() -> int | None:
    """This process's rank in its process group, None outside one."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def seed_as_lightning(worker_id: int, rank: int | None) -> None:
    """Lightning's worker seeding (each worker of each rank its own random streams),
    where ``seed_everything(workers=True)`` asked for it (``PL_SEED_WORKERS``). Lightning
    adds it only to a loader whose ``worker_init_fn`` is None, and the tuned one has
    ours, so ours runs it in its place; without it worker k of every rank would draw the
    same augmentations."""
    if os.environ.get("PL_SEED_WORKERS", "0") in ("", "0"):
        return
    try:
        from lightning.fabric.utilities.seed import pl_worker_init_function
    except ImportError:
        try:
            from lightning_fabric.utilities.seed import pl_worker_init_function
        except ImportError:
            return  # PL_SEED_WORKERS without Lightning: nothing asked for its seeding
    pl_worker_init_function(worker_id, rank=rank)


class WorkerThreads:
    """The tuned ``worker_init_fn`` of ``worker_threads``: in each worker process, the
    thread pools of the BLAS and OpenMP libraries loaded there (through threadpoolctl)
    and torch's intra-op pool held to ``threads``, and the variables those libraries
    read when they load set, for one a transform imports later; then the user's own
    ``worker_init_fn``, if any, or else Lightning's rank-aware seeding where
    ``seed_everything(workers=True)`` asked for it (:func:`seed_as_lightning`). A worker
    otherwise keeps what it inherited: a pool per library the size of the node (or of
    Ray's reservation), one per worker, all competing for the same cores. Picklable,
    so spawn and forkserver workers get it."""

    def __init__(
        self, threads: int, then: Callable[[int], None] | None = None, rank: int | None = None
    ) -> None:
        self.threads = threads
        self.then = then
        self.rank = _training_rank() if rank is None else rank

    def __call__(self, worker_id: int) -> None:
        from threadpoolctl import threadpool_limits

        for name in THREAD_VARIABLES:
            os.environ[name] = str(self.threads)
        threadpool_limits(limits=self.threads)  # as a call, the limits stay in force
        torch.set_num_threads(self.threads)
        if self.then is not None:
            self.then(worker_id)
        else:
            seed_as_lightning(worker_id, self.rank)

    def __repr__(self) -> str:
        return f"WorkerThreads({self.threads}, then={self.then!r})"


class Passes(Protocol):
    """What a loader's iterator tells of each pass: every batch that reaches the
    training loop (which worker made it, which of the pass's batches it is), and the
    pass's end."""

    def exhausted(self) -> bool:
        """The pass has delivered all its batches (a cut epoch ends here)."""

    def delivered(self, worker: int, index: int) -> bool:
        """Batch ``index`` of the pass (in the order its indices were sent), made by
        ``worker``, is ready; False drops it (a resumed pass's replay)."""

    def ended(self) -> None:
        """The pass has no more batches."""


class _Counting:
    """A DataLoader iterator that tells its loader's :class:`Passes` of each batch."""

    _last_worker = 0
    _last_index = 0
    _count = 0  # batches delivered this pass

    def __init__(self, loader: Any) -> None:
        self._passes: Passes = loader.passes
        super().__init__(loader)  # type: ignore[call-arg]

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._count = 0
        super()._reset(loader, first_iter)  # type: ignore[misc]

    def _next_data(self) -> Any:
        while True:
            if self._passes.exhausted():
                self._passes.ended()
                if not getattr(self, "_persistent_workers", False):
                    getattr(self, "_shutdown_workers", lambda: None)()
                raise StopIteration
            try:
                data = super()._next_data()  # type: ignore[misc]
            except StopIteration:
                self._passes.ended()
                raise
            # in order, the n-th delivered is the n-th sent; out of order, as received
            index = self._last_index if not getattr(self, "_in_order", True) else self._count
            self._count += 1
            if self._passes.delivered(self._last_worker, index):
                return data


class _CountedSingle(_Counting, _SingleProcessDataLoaderIter):
    pass


class _CountedWorkers(_Counting, _MultiProcessingDataLoaderIter):
    def _get_data(self) -> Any:
        index, data = super()._get_data()
        self._last_index = index  # out of order, the batch returned is the one received
        return index, data

    def _process_data(self, data: Any, worker_idx: int) -> Any:
        self._last_worker = worker_idx  # the data is this worker's (in order or not)
        return super()._process_data(data, worker_idx)


def counted_iterator(loader: DataLoader[Any]) -> Any:
    """``loader``'s iterator, telling ``loader.passes`` of every batch it delivers."""
    if loader.num_workers == 0:
        return _CountedSingle(loader)
    loader.check_worker_number_rationality()
    return _CountedWorkers(loader)


class SamplerPasses:
    """A map-style pass as its :class:`ShardSampler`'s clock counts it."""

    def __init__(self, sampler: Any) -> None:
        self.clock = sampler.clock if isinstance(sampler, ShardSampler) else None

    def exhausted(self) -> bool:
        """A sampler's epoch ends when the sampler does: never exhausted early."""
        return False

    def delivered(self, worker: int, index: int) -> bool:
        """A batch of the pass reached the loop: the epoch clock counts it."""
        if self.clock is not None:
            self.clock.took_at(index)
        return True

    def ended(self) -> None:
        """The pass was read to its end: the epoch clock moves on."""
        if self.clock is not None:
            self.clock.end()


def sampler_state(sampler: Any, batch_size: int | None) -> dict[str, Any]:
    """A map-style tuned loader's state: its sampler's epoch and the batches read."""
    state = sampler.state_dict() if hasattr(sampler, "state_dict") else {}
    return {**state, "world": process_group()[1], "batch_size": batch_size}


def load_sampler_state(sampler: Any, batch_size: int | None, state: dict[str, Any]) -> None:
    """Resume ``sampler`` from a loader's ``state_dict`` (refused in one line where the batch
    size differs)."""
    check_resumable(state, batch_size=batch_size)
    if hasattr(sampler, "load_state_dict"):
        sampler.load_state_dict(state)


def check_resumable(state: dict[str, Any], **now: Any) -> None:
    """Refuse, in one line, a mid-epoch state this loader would read other samples from
    (another world size, batch size or worker count changes every rank's share)."""
    if not isinstance(state, dict):
        raise ConfigError(f"a loader's state is a dict, got {type(state).__name__}")
    if not any(state.get("batches") or ()):
        return
    now = {"world": process_group()[1], **now}
    differ = [f"{k} {state.get(k)} then, {v} now" for k, v in now.items() if state.get(k) != v]
    if differ:
        raise ConfigError(
            f"the loader's state was saved mid-epoch ({'; '.join(differ)}): resume with the "
            "same settings, or from the start of an epoch"
        )


def _pinned(batch: Any) -> Any:
    """``batch`` in pinned host memory (tensors at any depth, or objects that pin)."""
    if isinstance(batch, torch.Tensor) or hasattr(batch, "pin_memory"):
        return batch.pin_memory()
    if isinstance(batch, (list, tuple)):
        return type(batch)(_pinned(item) for item in batch)
    if isinstance(batch, dict):
        return {k: _pinned(v) for k, v in batch.items()}
    return batch
