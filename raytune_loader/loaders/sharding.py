"""Which samples each data-parallel rank reads: its own share of every epoch, and the
same number of batches as every other rank.

The tuned loader shards itself. Map-style, its sampler, :class:`ShardSampler`, is a
``DistributedSampler`` (so Lightning, Fabric and Ray Train keep it instead of
rebuilding the loader without its tuned settings) that needs no process group when
it is made: the rank and world size are read when an epoch starts. The loader's own
iteration (:class:`RankBatches`) asks for this rank's shard; a trainer that rebuilds
the loader around its batch sampler and shards the batches itself (accelerate's
``prepare``) iterates the sampler directly and gets the whole epoch, which it then
splits. Every rank draws the same permutation (``seed`` + epoch) and takes every
world-size-th index of it, padded to an equal count per rank, as
``DistributedSampler`` does, so ranks step in lockstep.

Streams of shards whose sample counts are known (webdataset tar shards, Hugging Face
tables: :class:`raytune_loader.sources.base.ShardStream`) are split by sample, not by
shard (:func:`epoch_cut`, :func:`worker_range`, :func:`spans`): the epoch's shard order
(seeded by seed and epoch) is read as one sequence; each rank takes a contiguous
``samples // world`` of it (rounded down to whole batches with ``drop_last``), and a
rank's range is dealt to its loader workers in whole batches. Every rank gets the same
number of batches, no sample is read twice, and an epoch leaves out only the tail of
its order: fewer than ``world`` samples, or with ``drop_last`` fewer than one batch per
rank. Whatever started the ranks and the workers (torchrun, ``mp.spawn``, Lightning,
Ray Train; fork, spawn, forkserver or threads), the rank is read in the training
process and carried to each worker (:func:`carry`, :func:`as_thread_worker`): a worker
never guesses it from the environment.

:class:`EpochClock` is the epoch of a loader's passes: it advances by itself after
every pass until the trainer calls ``set_epoch``, and it holds how far the current
pass was read, for ``state_dict`` and a resumed epoch.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
from collections.abc import Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils.data import BatchSampler, Sampler
from torch.utils.data.distributed import DistributedSampler

from raytune_loader.errors import ConfigError

T = TypeVar("T")


_thread_worker = threading.local()
_carried: tuple[int, int] | None = None  # (rank, world) in a tuned loader's worker process


def worker_share() -> tuple[int, int]:
    """(worker, workers) of the loader worker this code runs in: a DataLoader worker
    process (``get_worker_info``), or a thread of the tuned thread loader; (0, 1) in the
    main process. Streaming sources split their shards by it, so thread workers split
    them too (``get_worker_info`` knows only processes)."""
    info = torch.utils.data.get_worker_info()
    if info is not None:
        return info.id, info.num_workers
    share = getattr(_thread_worker, "share", None)
    return (share[0], share[1]) if share else (0, 1)


@contextlib.contextmanager
def as_thread_worker(
    worker: int, workers: int, placement: tuple[int, int] | None = None
) -> Iterator[None]:
    """Run the block as thread worker ``worker`` of ``workers`` (see :func:`worker_share`),
    of the rank ``placement`` (rank, world) the loader read in the training process."""
    _thread_worker.share = (worker, workers, placement)
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


def carry(rank: int, world: int) -> None:
    """In a loader worker process: the rank the training process read (see
    :func:`placement`). The tuned loader's ``worker_init_fn`` calls it."""
    global _carried
    _carried = (rank, world)


NOT_THROUGH_THE_TUNED_LOADER = (
    "a tuned stream is read here by a loader the tool did not build (accelerate's "
    "prepare or skip_first_batches, a DataLoader of your own), whose workers cannot know "
    "their rank: iterate tuned.dataloader(stream) itself, outside accelerator.prepare, "
    "and resume with its load_state_dict"
)


def placement() -> tuple[int, int, int, int]:
    """(rank, world, worker, workers) of the code reading a stream now: in a worker
    process the rank the tuned loader carried to it (a ConfigError without one: the
    process group of a spawned worker does not exist, and a forked one's may be
    anybody's); in a thread worker the rank its loader read; in the training process
    its own process group."""
    info = torch.utils.data.get_worker_info()
    if info is not None:
        if _carried is None:
            raise ConfigError(NOT_THROUGH_THE_TUNED_LOADER)
        return (*_carried, info.id, info.num_workers)
    share = getattr(_thread_worker, "share", None)
    if share is not None:
        rank, world = share[2] or process_group()
        return rank, world, share[0], share[1]
    return (*process_group(), 0, 1)


class EpochClock:
    """The epoch of a loader's passes, and how far the current pass has been read.

    A pass read to its end moves the epoch on by itself, so the order changes even
    where nobody calls :meth:`set_epoch`; a pass abandoned early (a batch logged, a
    trainer's check that the loader iterates) does not. Once a trainer calls
    ``set_epoch`` (Lightning, accelerate, a DDP loop), only ``set_epoch`` moves it, so
    an extra pass on one rank cannot put that rank ahead of its peers.
    :meth:`state_dict` says which epoch is read and how many batches each worker has
    delivered (a map-style pass, whose batches may arrive out of order: how many from
    the start, and which beyond); after :meth:`load_state_dict`, the next pass of that
    epoch skips them.
    """

    def __init__(self) -> None:
        self.epoch = 0  # the next pass's
        self.explicit = False  # set_epoch was called: no more advancing by itself
        self.current: int | None = None  # the pass being read
        self.read: list[int] = []  # batches delivered this pass, per worker
        self.ahead: set[int] = set()  # map-style: delivered beyond read[0], by position
        self.skipped: frozenset[int] = frozenset()  # map-style: what this pass skips beyond
        self.yielded: list[int] = []  # map-style: the position of each batch the pass made
        self.finished = False
        self._resume: tuple[int, list[int], list[int]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """The trainer's epoch: it now sets every epoch, the passes no longer advance it."""
        self.epoch = int(epoch)
        self.explicit = True

    def begin(self, workers: int) -> tuple[int, list[int]]:
        """A pass starts: its epoch, and the batches each of its ``workers`` skips."""
        epoch = self.epoch
        skips, ahead = [0] * workers, []
        resume = self._resume
        if resume is not None and resume[0] == epoch and (any(resume[1]) or resume[2]):
            if len(resume[1]) != workers:
                raise ConfigError(
                    f"the loader's state was saved mid-epoch with {len(resume[1])} loader "
                    f"worker(s), this loader has {workers}: resume with the same num_workers"
                )
            skips, ahead = list(resume[1]), resume[2]
        self._resume = None
        self.current, self.read, self.finished = epoch, list(skips), False
        self.ahead, self.skipped, self.yielded = set(ahead), frozenset(ahead), []
        return epoch, skips

    def took(self, worker: int) -> None:
        """A batch of ``worker``'s reached the training loop."""
        if worker < len(self.read):
            self.read[worker] += 1

    def took_at(self, index: int) -> None:
        """The ``index``-th batch a map-style pass made reached the training loop."""
        if index >= len(self.yielded) or not self.read:
            return
        self.ahead.add(self.yielded[index])
        while self.read[0] in self.ahead:
            self.ahead.remove(self.read[0])
            self.read[0] += 1

    def end(self) -> None:
        """The pass was read to its end: the next one reads the next epoch, unless the
        trainer sets epochs itself."""
        if not self.finished and not self.explicit and self.current == self.epoch:
            self.epoch += 1
        self.finished = True

    def state_dict(self) -> dict[str, Any]:
        """The epoch, and the batches of it already read (an epoch being read resumes there)."""
        reading = self.current is not None and not self.finished
        return {
            "epoch": self.current if reading else self.epoch,
            "batches": list(self.read) if reading else [],
            "ahead": sorted(self.ahead) if reading else [],
            "explicit": self.explicit,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; a ConfigError for anything else."""
        try:
            epoch, batches = int(state["epoch"]), [int(b) for b in state["batches"]]
            ahead = [int(p) for p in state.get("ahead", ())]
            explicit = bool(state["explicit"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(
                f"not a tuned loader's state (epoch, batches, explicit): {state!r}"
            ) from None
        self.epoch, self.explicit, self.current = epoch, explicit, None
        self._resume = (epoch, batches, ahead)


class ShardSampler(DistributedSampler):  # type: ignore[type-arg]
    """A shuffled (or ordered) epoch over ``dataset``, split by rank when asked.

    ``samples`` is an epoch's length per rank (default: the dataset's share); longer
    epochs chain fresh permutations, as a measurement of many steps over a small
    subset needs. Iterated directly it yields the whole epoch (world size 1);
    :meth:`indices` gives any rank's share. Its epoch is an :class:`EpochClock`.
    """

    def __init__(
        self, dataset: Sized, *, shuffle: bool = True, seed: int = 0, samples: int | None = None
    ) -> None:
        # DistributedSampler.__init__ would need a process group now; its fields are set here
        self.dataset = dataset  # type: ignore[assignment]
        self.shuffle = shuffle
        self.seed = seed
        self.clock = EpochClock()
        self.drop_last = False
        self.samples = samples

    @property
    def epoch(self) -> int:  # type: ignore[override]
        """The epoch whose order this sampler gives."""
        return self.clock.epoch

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        """The ranks of the process group (1 without one), read when asked."""
        return process_group()[1]

    @property
    def rank(self) -> int:  # type: ignore[override]
        """This process's rank (0 without a process group), read when asked."""
        return process_group()[0]

    @property
    def num_samples(self) -> int:  # type: ignore[override]
        """Samples this rank reads an epoch."""
        return self.shard_length(self.num_replicas)

    @property
    def total_size(self) -> int:  # type: ignore[override]
        """Samples all ranks read an epoch (the dataset padded to a multiple of them)."""
        return self.num_samples * self.num_replicas

    def shard_length(self, world: int) -> int:
        """Samples each of ``world`` ranks reads an epoch."""
        if self.samples is not None:
            return self.samples
        return math.ceil(len(self.dataset) / world)  # type: ignore[arg-type]

    def order(self, epoch: int, rank: int, world: int) -> list[int]:
        """Rank ``rank``'s share of epoch ``epoch``."""
        size = len(self.dataset)  # type: ignore[arg-type]
        if size == 0:
            raise ConfigError("the dataset is empty: the tuned loader has nothing to read")
        total = self.shard_length(world) * world
        order: list[int] = []
        draw = 0
        while len(order) < total:  # padded, or chained for a long epoch
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch * 1_000_003 + draw)
                order += torch.randperm(size, generator=generator).tolist()
            else:
                order += range(size)
            draw += 1
        return order[rank:total:world]

    def indices(self, rank: int, world: int) -> list[int]:
        """Rank ``rank``'s share of the next pass's epoch."""
        epoch, _ = self.clock.begin(1)
        return self.order(epoch, rank, world)

    def __iter__(self) -> Iterator[int]:
        yield from self.indices(0, 1)
        self.clock.end()  # read whole (accelerate's shards of it)

    def __len__(self) -> int:
        return self.shard_length(1)

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch`` (the same order on every rank)."""
        self.clock.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch is (:meth:`EpochClock.state_dict`)."""
        return self.clock.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`."""
        self.clock.load_state_dict(state)


class RankBatches:
    """The batches the tuned loader itself reads: this rank's shard of the epoch when its
    sampler is a :class:`ShardSampler` (after a resumed state, less the batches already
    read); any other sampler's batches as they come."""

    def __init__(self, batch_sampler: BatchSampler) -> None:
        self.batch_sampler = batch_sampler
        self.sampler: Sampler[int] | Any = batch_sampler.sampler
        self.batch_size = batch_sampler.batch_size
        self.drop_last = batch_sampler.drop_last

    def __iter__(self) -> Iterator[list[int]]:
        if not isinstance(self.sampler, ShardSampler):
            yield from self.batch_sampler
            return
        clock = self.sampler.clock
        epoch, skips = clock.begin(1)
        shard = self.sampler.order(epoch, *process_group())
        size = self.batch_sampler.batch_size
        for position, start in enumerate(range(0, len(shard), size)):
            batch = shard[start : start + size]
            if position < skips[0] or position in clock.skipped:
                continue  # read before the state was saved
            if len(batch) == size or not self.batch_sampler.drop_last:
                clock.yielded.append(position)
                yield batch

    def __len__(self) -> int:
        if not isinstance(self.sampler, ShardSampler):
            return len(self.batch_sampler)
        samples = self.sampler.shard_length(process_group()[1])
        size = self.batch_sampler.batch_size
        return samples // size if self.batch_sampler.drop_last else math.ceil(samples / size)


@dataclass(frozen=True)
class EpochCut:
    """What every rank reads of one epoch of a planned stream."""

    per_rank: int  # samples
    batches: int  # batches of ``batch_size``, the last one partial without drop_last


def epoch_cut(total: int, world: int, batch_size: int, drop_last: bool) -> EpochCut:
    """The epoch of ``total`` samples cut to an equal share per rank: ``total // world``,
    rounded down to whole batches with ``drop_last``."""
    per_rank = total // world
    if drop_last:
        per_rank -= per_rank % batch_size
    return EpochCut(per_rank, -(-per_rank // batch_size))


def worker_range(cut: EpochCut, batch_size: int, worker: int, workers: int) -> tuple[int, int]:
    """Worker ``worker``'s samples within its rank's range, in whole batches: the first
    ``batches % workers`` workers take one batch more; the partial batch, if any, is the
    last worker's with batches."""
    base, extra = divmod(cut.batches, workers)
    start = (worker * base + min(worker, extra)) * batch_size
    mine = base + (1 if worker < extra else 0)
    return min(start, cut.per_rank), min(cut.per_rank, start + mine * batch_size)


def shard_order(shards: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's order of the shards: the same on every rank, another every epoch."""
    if not shuffle:
        return list(range(shards))
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(shards, generator=generator).tolist()


@dataclass(frozen=True)
class Span:
    """Samples ``start`` to ``stop`` (excluded) of the shard at ``shard``."""

    shard: int
    start: int
    stop: int


def spans(sizes: Sequence[int], order: Sequence[int], start: int, stop: int) -> list[Span]:
    """Positions ``start`` to ``stop`` of the sequence the shards in ``order`` make,
    as spans of shards."""
    out = []
    offset = 0
    for shard in order:
        size = sizes[shard]
        low, high = max(start, offset), min(stop, offset + size)
        if low < high:
            out.append(Span(shard, low - offset, high - offset))
        offset += size
        if offset >= stop:
            break
    return out
