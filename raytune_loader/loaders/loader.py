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
(:mod:`raytune_loader.loaders.sharding`), so a trainer that keeps the loader (Lightning,
Ray Train, a DDP loop) or rebuilds it from its arguments (accelerate) runs the tuned
settings on the right samples; the rank measurements of ``--ranks-per-node`` build
their loaders the same way, after :func:`use_platform_start_method` (a rank is a
forkserver's child; its loaders start their workers as a torchrun rank's do). Their
``state_dict``/``load_state_dict`` carry the epoch and the batches read, so a resumed
run picks the epoch up where it stopped.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    default_collate,
)
from torch.utils.data.distributed import DistributedSampler

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import ConfigError
from raytune_loader.loaders.batches import (
    Passes,
    SamplerPasses,
    Stamping,
    WorkerThreads,
    close_at_exit,
    counted_iterator,
    fetch_batch,
    load_sampler_state,
    sampler_state,
    set_cached,
    set_fetch_threads,
    timed,
)
from raytune_loader.loaders.sharding import RankBatches, ShardSampler, process_group
from raytune_loader.pipeline.device import collate_encoded

if TYPE_CHECKING:
    from raytune_loader.loaders.streams import StreamLoader, ThreadStreamLoader


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
    reads its own share of every epoch (:mod:`raytune_loader.loaders.sharding`), whoever iterates
    it. ``samples_per_epoch`` (per rank) makes an epoch longer or shorter than the data
    (a stream of the user's in a process group: the batches every rank reads).
    ``stamp`` (measurements only) yields every batch as a :class:`Stamped`: which worker
    made it and when it was done.

    Args:
        dataset: a map-style dataset, or a stream (an ``IterableDataset``).
        config: the candidate.
        shuffle: a new order every epoch.
        drop_last: leave out an epoch's last, incomplete batch.
        timeout_s: the DataLoader's ``timeout`` (0: none).
        seed: the seed of the epochs' order (None: another each run).
        samples_per_epoch: how many samples a rank reads an epoch (default: its share).
        stamp: yield :class:`Stamped` batches (measurements only).
        **overrides: DataLoader arguments that win over ``config``'s.

    Returns:
        A loader with a DataLoader's attributes: a ``DataLoader`` of worker processes, a
        loader of ``torchdata.nodes`` thread workers, or a stream's loader.
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
        from raytune_loader.loaders.streams import stream_loader

        return stream_loader(
            dataset, config, kwargs, set(overrides), drop_last=drop_last, timeout_s=timeout_s,
            stamp=stamp, seed=seed, shuffle=shuffle, samples_per_epoch=samples_per_epoch,
        )  # fmt: skip
    set_fetch_threads(dataset, config.fetch_threads)  # a remote dataset's requests in flight
    set_cached(dataset, config.cache)  # and its objects kept on the node's disk, or not
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


class TunedDataLoader(DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` that reads its own rank's shard when it runs in a process group.

    Its constructor is DataLoader's, so trainers that rebuild a loader from its
    arguments (Lightning) rebuild it with the tuned ones. Only its own iteration is
    sharded by rank (:class:`~raytune_loader.loaders.sharding.RankBatches`); its
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
        """How this loader's epochs are counted: by its sampler."""
        return SamplerPasses(self.sampler)

    def _get_iterator(self) -> Any:
        return counted_iterator(self)

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch is (its sampler's state), to resume it with
        :meth:`load_state_dict`."""
        return sampler_state(self.sampler, self.batch_size)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume an epoch where :meth:`state_dict` left it."""
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
            return index, collate_fn(fetch_batch(dataset, indices))

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
        # what a DataLoader also has, as threads have them: started anew each epoch, no
        # process, no seed or start method of their own, no timeout
        self.persistent_workers = False
        self.timeout = 0.0
        self.worker_init_fn = None
        self.generator = None
        self.multiprocessing_context = None
        self.pin_memory_device = ""
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
        return close_at_exit(self._epoch())

    def _epoch(self) -> Generator[Any, None, None]:
        passes = SamplerPasses(self.sampler)
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
        """Resume an epoch where :meth:`state_dict` left it."""
        load_sampler_state(self.sampler, self.batch_size, state)


class _Numbered:
    """Batches of indices, each with its place in the pass."""

    def __init__(self, batches: RankBatches) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        return enumerate(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


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
