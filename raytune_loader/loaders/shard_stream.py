"""A stream over shards of known sample counts: :class:`ShardStream`.

Sources of shards whose samples can be counted (webdataset, Hugging Face tables) build
one: a stream over their shards, planned by :mod:`raytune_loader.loaders.sharding` so
that every rank reads its own samples and as many batches as every other rank, each
epoch in another order. :class:`StreamVariant` says how a stream is read (a pipeline
variant's worker side, batched in the workers or not, shuffled);
:class:`RayRead` how Ray Data's own readers take the same shards.
"""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.utils.data import IterableDataset, default_collate

from raytune_loader.errors import ConfigError
from raytune_loader.loaders.sharding import (
    EpochClock,
    epoch_cut,
    placement,
    shard_order,
    spans,
    worker_range,
)

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class StreamVariant:
    """How a stream is read: a pipeline variant's worker side, batches made in the
    workers (``batch_size``) or by the loader (``None``), and the user's shuffling."""

    transfer: str = "float32"
    decode: str = "pil"
    batch_size: int | None = None  # batched by the stream itself, in each worker
    shuffle_buffer: int = 0  # samples; shards are shuffled too when it is above 0
    seed: int | None = 0  # of the shard order; None: another order each run (training)
    repeat: bool = False  # its shards over and over: one loader epoch as long as needed


@dataclass(frozen=True)
class RayRead:
    """How Ray Data reads a source's files with its own reader (``read_webdataset`` or
    ``read_parquet``, :mod:`raytune_loader.raydata`): the files, the rows they hold in all,
    the columns to read, and the source's own decoder of one row (a dict of its columns)
    into the pipeline variant's ``(sample, class)``, so the actors make what a DataLoader
    worker makes. Plain data: the sources do not import Ray."""

    reader: str  # "webdataset" or "parquet"
    paths: tuple[str, ...]
    rows: int
    decoded: Callable[[dict[str, Any]], tuple[Any, int]]
    columns: tuple[str, ...] = ()  # all of them when empty
    store: Any = None  # the stores.Store the files are objects of (read as s3:// paths)


class ShardReader(Protocol):
    """How a source reads its shards (picklable: worker processes get it)."""

    def count(self, path: str) -> int:
        """Samples in the shard."""

    def read(self, path: str, start: int, stop: int) -> Iterator[Any]:
        """The shard's raw samples ``start`` to ``stop`` (excluded), not decoded."""

    def ray_reader(self, paths: Sequence[str]) -> str | None:
        """Ray Data's reader of these shards (:attr:`RayRead.reader`), or None: none."""


def _shared(values: int) -> torch.Tensor:
    """Integers the training process writes and its loader workers read, persistent
    workers included (shared memory, as Hugging Face keeps its epoch)."""
    return torch.zeros(values, dtype=torch.int64).share_memory_()


class ShardStream(IterableDataset):  # type: ignore[type-arg]
    """A stream over shards of known sample counts, read as :mod:`raytune_loader.loaders.sharding`
    plans each epoch: this rank's contiguous share of the epoch's shard order, this
    loader worker's whole batches of it. A worker's raw samples pass the shuffle buffer
    (seeded by seed, epoch, rank and worker), then are decoded, then batched in the
    worker when ``batch_size`` is set. With ``repeat`` a worker reads epoch after epoch
    without end (a trial's one long loader epoch).

    The tuned loader gives it its batch size and ``drop_last`` (:meth:`for_loader`),
    each pass's epoch and the batches a resumed pass skips (shared memory, read by
    worker processes when they start a pass), and carries the rank to its workers.
    Iterated directly, in the training process, it reads its process group's share of
    the epoch last set (:meth:`set_epoch`)."""

    def __init__(
        self,
        shards: Sequence[str],
        sizes: Sequence[int],
        reader: ShardReader,
        decode: Callable[[Any], Any],
        *,
        shuffle_buffer: int = 0,
        seed: int | None = 0,
        repeat: bool = False,
        batch_size: int | None = None,
        collate: Callable[[list[Any]], Any] | None = None,
        classes: list[str] | None = None,
    ) -> None:
        self.shards = tuple(shards)
        self.sizes = tuple(sizes)
        self.reader = reader
        self.decode = decode
        self.shuffle_buffer = shuffle_buffer
        self.shuffle = shuffle_buffer > 0  # shards too; without a buffer, neither
        self.seed = 0 if seed is None else seed  # every rank must draw the same order
        self.repeat = repeat
        self.batch_size = batch_size  # batches made in each worker
        self.collate = collate or default_collate
        self.loader_batch = batch_size or 1  # the loader's batches, which ranks count
        self.drop_last = False
        self.classes = classes
        # shards fetched at once per worker, where the reader fetches them from a store
        # (its ``reads``); the store, where there is one, for the measurement's counts
        self.fetch_threads = 1
        self.store = getattr(reader, "store", None)
        self.clock = EpochClock()  # shared with the loaders' copies (for_loader)
        self._pass = _shared(2)  # [epoch, batches worker 0 skips, worker 1's...]
        self._for_loader = False

    @property
    def batched_in_workers(self) -> bool:
        """Whether the workers make the loader's batches (webdataset's ``.batched()``)."""
        return self.batch_size is not None

    def ray_read(self) -> RayRead | None:
        """These shards as Ray Data reads them (each sample once an epoch), with this
        stream's decoder; None where Ray has no reader for them."""
        reader = self.reader.ray_reader(self.shards)
        if reader is None:
            return None
        columns = tuple(getattr(self.reader, "columns", ()))
        store = getattr(self.reader, "store", None)
        return RayRead(reader, tuple(self.shards), sum(self.sizes), self.decode, columns, store)

    def for_loader(
        self,
        *,
        batch_size: int | None,
        collate: Callable[[list[Any]], Any] | None,
        drop_last: bool,
        workers: int,
        seed: int | None = None,
        shuffle: bool = True,
    ) -> ShardStream:
        """This stream as a loader reads it: batches of ``batch_size`` (made in the
        workers where this stream batches, ``collate`` making them there), ``drop_last``,
        ``workers`` workers; ``seed`` and ``shuffle=False`` as the loader was asked.
        The copy shares this stream's epoch."""
        stream = copy.copy(self)
        if self.batched_in_workers:
            stream.batch_size = batch_size
            stream.collate = collate or self.collate
        stream.loader_batch = batch_size or 1
        stream.drop_last = drop_last
        stream.seed = self.seed if seed is None else seed
        stream.shuffle = self.shuffle and shuffle
        stream.shuffle_buffer = self.shuffle_buffer if stream.shuffle else 0
        stream._pass = _shared(1 + max(1, workers))
        stream._for_loader = True  # its passes are the loader's to set (start_pass)
        return stream

    def batches_per_rank(self, world: int) -> int:
        """Batches every rank reads in an epoch (a ConfigError where it cannot)."""
        if len(self.shards) < world:
            raise ConfigError(
                f"the stream has {len(self.shards)} shards for {world} ranks: every rank "
                f"reads shards of its own; write the data in at least {world} shards"
            )
        cut = epoch_cut(sum(self.sizes), world, self.loader_batch, self.drop_last)
        if cut.batches == 0:
            raise ConfigError(
                f"the stream holds {sum(self.sizes)} samples, fewer than one batch of "
                f"{self.loader_batch} for each of {world} ranks: use a smaller batch_size"
            )
        return cut.batches

    def samples_per_rank(self, world: int) -> int:
        """Samples every rank reads in an epoch of ``world`` ranks."""
        return epoch_cut(sum(self.sizes), world, self.loader_batch, self.drop_last).per_rank

    def start_pass(self, epoch: int, skips: Sequence[int]) -> None:
        """The pass about to start reads ``epoch``, worker i skipping ``skips[i]`` batches."""
        self._pass.zero_()
        self._pass[0] = epoch
        for worker, skip in enumerate(skips[: len(self._pass) - 1]):
            self._pass[1 + worker] = skip

    def set_epoch(self, epoch: int) -> None:
        """Another order for ``epoch`` (call it in every rank before the epoch, or on the
        loader's sampler); the loader's passes stop advancing the epoch by themselves."""
        self.clock.set_epoch(epoch)
        if not self._for_loader:  # a loader's copy: its next pass takes it, not this one
            self._pass[0] = epoch

    def __iter__(self) -> Iterator[Any]:
        rank, world, worker, workers = placement()
        self.batches_per_rank(world)  # refused in one line
        epoch = int(self._pass[0])
        skip = int(self._pass[1 + worker]) if 1 + worker < len(self._pass) else 0
        place = (rank, world, worker, workers)
        if not self.repeat:
            raw = self._raw(epoch, *place)
            yield from self._made(raw, epoch, rank, worker, skip, self.shuffle_buffer)
            return
        # a trial's: one shuffle buffer across its epochs, as over a long training epoch:
        # once full, every sample taken out is one read in (a buffer refilled each epoch
        # would fetch every shard before its first sample, then hand out the buffer
        # without a read, and a short window could see no request to a store at all). It
        # holds at most an epoch of this worker's samples: full, its size no longer
        # changes the pace, and a larger one would only repeat the same samples
        low, high = self._share(world, worker, workers)
        buffer = min(self.shuffle_buffer, high - low)
        yield from self._made(self._repeated(epoch, place), epoch, rank, worker, skip, buffer)

    def _repeated(self, epoch: int, place: tuple[int, int, int, int]) -> Iterator[Any]:
        """Raw samples of ``epoch`` and the ones after it, without end (none where a
        worker has no sample in an epoch: it has none in any). Its shards are read as one
        run across the epochs, so a store's read-ahead does not stop at an epoch's end
        (a trial's epochs are a few shards; a training epoch's, thousands)."""

        def wanted() -> Iterator[tuple[str, int, int]]:
            current = epoch
            while spans_of := self._wanted(current, *place):
                yield from spans_of
                current += 1

        yield from self._read(wanted())

    def _raw(self, epoch: int, rank: int, world: int, worker: int, workers: int) -> Iterator[Any]:
        """This worker's raw samples of ``epoch``, in its shards' order, not decoded."""
        yield from self._read(iter(self._wanted(epoch, rank, world, worker, workers)))

    def _wanted(
        self, epoch: int, rank: int, world: int, worker: int, workers: int
    ) -> list[tuple[str, int, int]]:
        """This worker's spans of ``epoch``: (shard, first sample, last excluded)."""
        low, high = self._share(world, worker, workers)
        start = rank * epoch_cut(sum(self.sizes), world, self.loader_batch, self.drop_last).per_rank
        order = shard_order(len(self.shards), self.seed, epoch, self.shuffle)
        return [(self.shards[span.shard], span.start, span.stop)
                for span in spans(self.sizes, order, start + low, start + high)]  # fmt: skip

    def _read(self, wanted: Iterator[tuple[str, int, int]]) -> Iterator[Any]:
        """The raw samples of the ``wanted`` spans, in order; a store's reader fetches
        ``fetch_threads`` shards ahead (its ``reads``)."""
        reads = getattr(self.reader, "reads", None)
        if reads is not None:
            yield from reads(wanted, self.fetch_threads)
            return
        yield from (sample for path, a, b in wanted for sample in self.reader.read(path, a, b))

    def _share(self, world: int, worker: int, workers: int) -> tuple[int, int]:
        """This worker's samples of its rank's share of an epoch: (first, last excluded)."""
        cut = epoch_cut(sum(self.sizes), world, self.loader_batch, self.drop_last)
        return worker_range(cut, self.loader_batch, worker, workers)

    def _made(
        self, raw: Iterator[Any], epoch: int, rank: int, worker: int, skip: int, buffer: int
    ) -> Iterator[Any]:
        """``raw`` through a shuffle buffer of ``buffer`` samples, less the batches a
        resumed pass skips, decoded, and batched where this stream batches in its workers."""
        if buffer > 0:
            rng = random.Random(f"{self.seed}:{epoch}:{rank}:{worker}")
            raw = _shuffled(raw, buffer, rng)
        # a resumed pass replays the order undecoded and drops what was read before
        samples = map(self.decode, itertools.islice(raw, skip * self.loader_batch, None))
        if self.batch_size is None:
            yield from samples
            return
        while chunk := list(itertools.islice(samples, self.batch_size)):
            yield self.collate(chunk)


def _shuffled(items: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """``items`` through a shuffle buffer of ``size``: each comes out at a random time
    after the buffer is full, the rest in random order at the end."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        index = rng.randrange(size)
        buffer[index], item = item, buffer[index]
        yield item
    rng.shuffle(buffer)
    yield from buffer
