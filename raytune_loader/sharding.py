"""Which samples each data-parallel rank reads: one shard each, every epoch.

The tuned loader shards itself. Its sampler, :class:`ShardSampler`, is a
``DistributedSampler`` (so Lightning, Fabric and Ray Train keep it instead of
rebuilding the loader without its tuned settings) that needs no process group
when it is made: the rank and world size are read when an epoch starts. The
loader's own iteration (:class:`RankBatches`) asks for this rank's shard; a
trainer that rebuilds the loader around its batch sampler and shards the batches
itself (accelerate's ``prepare``) iterates the sampler directly and gets the
whole epoch, which it then splits. Either way each rank reads its own shard once
per epoch.

The epoch advances by itself after every pass, so the order changes each epoch
even where nobody calls ``set_epoch``; ``set_epoch(n)`` (which Lightning,
accelerate and a DDP loop call) sets it. Every rank draws the same permutation
(``seed`` + epoch) and takes every world-size-th index of it, padded to an equal
count per rank, as ``DistributedSampler`` does, so ranks step in lockstep.

Streaming sources split their shards instead: by rank (their format's own splitter,
webdataset's ``split_by_node``, Hugging Face's ``split_dataset_by_node``) and by loader
worker, process or thread (:func:`split_by_worker`, :func:`worker_share`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
from collections.abc import Iterable, Iterator, Sized
from typing import Any, TypeVar

import torch
from torch.utils.data import BatchSampler, Sampler
from torch.utils.data.distributed import DistributedSampler

from raytune_loader.errors import ConfigError

T = TypeVar("T")


_thread_worker = threading.local()


def worker_share() -> tuple[int, int]:
    """(worker, workers) of the loader worker this code runs in: a DataLoader worker
    process (``get_worker_info``), or a thread of the tuned thread loader; (0, 1) in the
    main process. Streaming sources split their shards by it, so thread workers split
    them too (``get_worker_info`` knows only processes)."""
    info = torch.utils.data.get_worker_info()
    if info is not None:
        return info.id, info.num_workers
    return getattr(_thread_worker, "share", (0, 1))


@contextlib.contextmanager
def as_thread_worker(worker: int, workers: int) -> Iterator[None]:
    """Run the block as thread worker ``worker`` of ``workers`` (see :func:`worker_share`)."""
    _thread_worker.share = (worker, workers)
    try:
        yield
    finally:
        del _thread_worker.share


def split_by_worker(items: Iterable[T]) -> Iterator[T]:
    """This loader worker's share of ``items`` (process or thread)."""
    worker, workers = worker_share()
    return itertools.islice(items, worker, None, workers)


def process_group() -> tuple[int, int]:
    """(rank, world size) of this process's default process group; (0, 1) without one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ShardSampler(DistributedSampler):  # type: ignore[type-arg]
    """A shuffled (or ordered) epoch over ``dataset``, split by rank when asked.

    ``samples`` is an epoch's length per rank (default: the dataset's share); longer
    epochs chain fresh permutations, as a measurement of many steps over a small
    subset needs. Iterated directly it yields the whole epoch (world size 1);
    :meth:`indices` gives any rank's share.
    """

    def __init__(
        self, dataset: Sized, *, shuffle: bool = True, seed: int = 0, samples: int | None = None
    ) -> None:
        # DistributedSampler.__init__ would need a process group now; its fields are set here
        self.dataset = dataset  # type: ignore[assignment]
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.drop_last = False
        self.samples = samples

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        return process_group()[1]

    @property
    def rank(self) -> int:  # type: ignore[override]
        return process_group()[0]

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        return self.shard_length(self.num_replicas)

    @property
    def total_size(self) -> int:  # type: ignore[override]
        return self.num_samples * self.num_replicas

    def shard_length(self, world: int) -> int:
        if self.samples is not None:
            return self.samples
        return math.ceil(len(self.dataset) / world)  # type: ignore[arg-type]

    def indices(self, rank: int, world: int) -> list[int]:
        """Rank ``rank``'s share of this epoch, then the epoch advances."""
        size = len(self.dataset)  # type: ignore[arg-type]
        if size == 0:
            raise ConfigError("the dataset is empty: the tuned loader has nothing to read")
        total = self.shard_length(world) * world
        order: list[int] = []
        draw = 0
        while len(order) < total:  # padded, or chained for a long epoch
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + self.epoch * 1_000_003 + draw)
                order += torch.randperm(size, generator=generator).tolist()
            else:
                order += range(size)
            draw += 1
        self.epoch += 1
        return order[rank:total:world]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices(0, 1))

    def __len__(self) -> int:
        return self.shard_length(1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class RankBatches:
    """The batches the tuned loader itself reads: this rank's shard of the epoch when its
    sampler is a :class:`ShardSampler`; any other sampler's batches as they come."""

    def __init__(self, batch_sampler: BatchSampler) -> None:
        self.batch_sampler = batch_sampler
        self.sampler: Sampler[int] | Any = batch_sampler.sampler

    def __iter__(self) -> Iterator[list[int]]:
        if not isinstance(self.sampler, ShardSampler):
            yield from self.batch_sampler
            return
        shard = self.sampler.indices(*process_group())
        size = self.batch_sampler.batch_size
        for start in range(0, len(shard), size):
            batch = shard[start : start + size]
            if len(batch) == size or not self.batch_sampler.drop_last:
                yield batch

    def __len__(self) -> int:
        if not isinstance(self.sampler, ShardSampler):
            return len(self.batch_sampler)
        samples = self.sampler.shard_length(process_group()[1])
        size = self.batch_sampler.batch_size
        return samples // size if self.batch_sampler.drop_last else math.ceil(samples / size)
