"""The one place a loader is built from a :class:`LoaderConfig`.

Trials, the verification step, the bench and users' training code (through
``load_best_config(...).dataloader(dataset)``) all call :func:`build_dataloader`,
so what was measured is what users get. Worker processes are PyTorch's
``DataLoader``; thread workers are ``torchdata.nodes`` (PyTorch's maintained
node-based loader): each thread builds whole batches, as a DataLoader worker does,
so ``num_workers``, ``prefetch_factor`` and ``in_order`` mean the same in both. A
stream (an IterableDataset) gets :mod:`raytune_loader.streams`' loaders: a DataLoader
without a sampler inside, or plain threads, each a worker of the stream's split.
Worker processes with ``worker_threads`` set start with :class:`WorkerThreads` as
their ``worker_init_fn``: the thread pools of BLAS, OpenMP and torch held to that
many threads in each.

In a process group both read their own rank's shard of every epoch
(:mod:`raytune_loader.sharding`), so a trainer that keeps the loader (Lightning,
Ray Train, a DDP loop) or rebuilds it from its arguments (accelerate) runs the tuned
settings on the right samples; the rank measurements of ``--ranks-per-node`` build
their loaders the same way, after :func:`use_platform_start_method` (a rank is a
forkserver's child; its loaders start their workers as a torchrun rank's do). Their
``state_dict``/``load_state_dict`` carry the epoch and the batches read, so a resumed
run picks the epoch up where it stopped.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    default_collate,
)
from torch.utils.data.dataloader import (
    _MultiProcessingDataLoaderIter,
    _SingleProcessDataLoaderIter,
)
from torch.utils.data.distributed import DistributedSampler

from raytune_loader.errors import ConfigError
from raytune_loader.pipeline import collate_encoded
from raytune_loader.sharding import RankBatches, ShardSampler, process_group
from raytune_loader.space import LoaderConfig

if TYPE_CHECKING:
    from raytune_loader.streams import StreamLoader, ThreadStreamLoader


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
) -> TunedDataLoader | ThreadLoader | StreamLoader | ThreadStreamLoader:
    """The tuned loader over ``dataset``; ``overrides`` (DataLoader arguments) win over
    the config, or are refused in one line. Map-style thread workers take ``sampler``
    and ``collate_fn`` among them; a stream's overrides: :func:`streams.stream_loader`.

    Without a ``sampler`` override the loader shards itself in a process group: each rank
    reads its own share of every epoch (:mod:`raytune_loader.sharding`), whoever iterates
    it. ``samples_per_epoch`` (per rank) makes an epoch longer or shorter than the data
    (a stream of the user's in a process group: the batches every rank reads).
    ``stamp`` (measurements only) yields every batch as a :class:`Stamped`: which worker
    made it and when it was done.
    """
    kwargs: dict[str, Any] = config.kwargs()
    if config.pin_memory and not torch.cuda.is_available():
        kwargs["pin_memory"] = False  # pinning needs an accelerator; it would only warn
    if config.decode == "device":
        kwargs["collate_fn"] = collate_encoded  # JPEGs of different lengths stay a list
    kwargs.update(overrides)
    timeout_s = kwargs.pop("timeout", timeout_s)  # DataLoader's own name for it
    if kwargs["num_workers"] == 0:
        for key in ("prefetch_factor", "persistent_workers", "multiprocessing_context"):
            if key not in overrides:
                kwargs.pop(key, None)  # DataLoader accepts them only with workers
        timeout_s = 0.0  # DataLoader only accepts a timeout with workers
    if isinstance(dataset, IterableDataset):
        from raytune_loader.streams import stream_loader

        return stream_loader(
            dataset, config, kwargs, set(overrides), drop_last=drop_last, timeout_s=timeout_s,
            stamp=stamp, seed=seed, shuffle=shuffle, samples_per_epoch=samples_per_epoch,
        )  # fmt: skip
    if config.worker_threads is not None:  # worker processes only (LoaderConfig checks)
        then = kwargs.get("worker_init_fn")  # the user's own runs after ours
        kwargs["worker_init_fn"] = WorkerThreads(config.worker_threads, then)
    if stamp:
        dataset = timed(dataset)
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
            kwargs.get("collate_fn") or default_collate, kwargs["num_workers"],
            kwargs.get("prefetch_factor") or 2, kwargs["in_order"], kwargs["pin_memory"],
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


class _SamplerPasses:
    """A map-style pass as its :class:`ShardSampler`'s clock counts it."""

    def __init__(self, sampler: Any) -> None:
        self.clock = sampler.clock if isinstance(sampler, ShardSampler) else None

    def exhausted(self) -> bool:
        return False

    def delivered(self, worker: int, index: int) -> bool:
        if self.clock is not None:
            self.clock.took_at(index)
        return True

    def ended(self) -> None:
        if self.clock is not None:
            self.clock.end()


def sampler_state(sampler: Any, batch_size: int | None) -> dict[str, Any]:
    """A map-style tuned loader's state: its sampler's epoch and the batches read."""
    state = sampler.state_dict() if hasattr(sampler, "state_dict") else {}
    return {**state, "world": process_group()[1], "batch_size": batch_size}


def load_sampler_state(sampler: Any, batch_size: int | None, state: dict[str, Any]) -> None:
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


class TunedDataLoader(DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` that reads its own rank's shard when it runs in a process group.

    Its constructor is DataLoader's, so trainers that rebuild a loader from its
    arguments (Lightning) rebuild it with the tuned ones. Only its own iteration is
    sharded by rank (:class:`~raytune_loader.sharding.RankBatches`); its
    ``batch_sampler`` yields whole epochs, for trainers that split batches themselves.
    ``state_dict``/``load_state_dict`` (Lightning's checkpoints call them; register the
    loader with accelerate's ``register_for_checkpointing``) carry the epoch and the
    batches read: a resumed pass of that epoch skips them.
    """

    @property
    def _index_sampler(self) -> Any:
        index_sampler = super()._index_sampler
        if isinstance(index_sampler, BatchSampler):
            return RankBatches(index_sampler)
        return index_sampler

    @property
    def passes(self) -> Passes:
        return _SamplerPasses(self.sampler)

    def _get_iterator(self) -> Any:
        return counted_iterator(self)

    def state_dict(self) -> dict[str, Any]:
        return sampler_state(self.sampler, self.batch_size)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_sampler_state(self.sampler, self.batch_size, state)


class ThreadLoader:
    """Batches from ``num_workers`` threads (``torchdata.nodes``): each thread reads
    and collates a whole batch; up to ``prefetch_factor`` x ``num_workers`` batches
    wait ready. Iterating again starts a new epoch, like a DataLoader. Decoding and
    the tensor transforms release the GIL; a Python-heavy ``__getitem__`` does not.

    It has a DataLoader's attributes (``dataset``, ``sampler``, ``batch_sampler``,
    ``batch_size``, ``num_workers``...) so trainers find its sampler (to call
    ``set_epoch``) and see that it is already sharded; no trainer rebuilds it (its
    ``batch_sampler`` is this rank's batches, so accelerate's ``skip_first_batches``,
    which builds a DataLoader of its own from it, reads this rank's rest of the epoch;
    its ``load_state_dict`` resumes with the tuned threads)."""

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

        def batch(numbered: tuple[int, Sequence[int]]) -> tuple[int, Any]:
            index, indices = numbered  # which of the pass's batches: for its state
            return index, collate_fn([dataset[i] for i in indices])

        self.dataset = dataset
        self._batches = RankBatches(batch_sampler)
        # this rank's batches: accelerate's skip_first_batches rebuilds a loader from it
        self.batch_sampler = self._batches
        self.sampler = batch_sampler.sampler
        self.batch_size = batch_sampler.batch_size
        self.drop_last = batch_sampler.drop_last
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.in_order = in_order
        self.pin_memory = pin_memory
        node: Any = tn.ParallelMapper(
            tn.SamplerWrapper(_Numbered(self._batches)),  # type: ignore[arg-type]
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
        passes = _SamplerPasses(self.sampler)
        try:
            for index, batch in self._loader:
                passes.delivered(0, index)
                yield batch
            passes.ended()
        finally:  # an epoch ended, failed or was abandoned: its threads stop, here
            _stop_threads(self._loader)

    def __len__(self) -> int:
        return len(self._batches)

    def state_dict(self) -> dict[str, Any]:
        """The sampler's epoch and the batches read (see :class:`TunedDataLoader`)."""
        return sampler_state(self.sampler, self.batch_size)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_sampler_state(self.sampler, self.batch_size, state)


class _Numbered:
    """Batches of indices, each with its place in the pass."""

    def __init__(self, batches: RankBatches) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        return enumerate(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


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
