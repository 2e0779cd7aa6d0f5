"""What every kind of data source says about itself, and its defaults.

A :class:`Source` is one kind of data (image folders, torchvision's sets, a user's
factory...): the ``--dataset`` names it answers to, how to make its data ready and
build it into a ``torch.utils.data.Dataset`` with a pipeline variant's worker-side
stages, and what it can do: which decoders it offers, whether the search may
choose how its pipeline is built, whether it is map-style or streams, which files
to pre-warm, how many classes it has. The rest of the package asks the source and
never branches on a dataset's name.

Sources of shards whose samples can be counted (webdataset, Hugging Face tables)
build a :class:`ShardStream`: a stream over their shards, planned by
:mod:`raytune_loader.sharding` so that every rank reads its own samples and as many
batches as every other rank, each epoch in another order.
"""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.utils.data import Dataset, IterableDataset, Subset, default_collate

from raytune_loader.errors import ConfigError, DatasetError
from raytune_loader.sharding import (
    EpochClock,
    epoch_cut,
    placement,
    shard_order,
    spans,
    worker_range,
)

if TYPE_CHECKING:
    from raytune_loader.progress import Progress


class Spec(Protocol):
    """What a source reads of a dataset's description
    (:class:`raytune_loader.datasets.Spec` is one): the sources sit below the
    module that describes datasets by name, so they name only what they read."""

    @property
    def name(self) -> str: ...
    @property
    def data_root(self) -> str | None: ...
    @property
    def download(self) -> bool: ...
    @property
    def synthetic_images(self) -> int: ...
    @property
    def image_column(self) -> str: ...
    @property
    def label_column(self) -> str: ...
    @property
    def shuffle_buffer(self) -> int | None: ...


def prewarm(files: list[str]) -> int:
    """Read each file once so every trial starts with the same page-cache state."""
    total = 0
    for name in files:
        with open(name, "rb") as handle:
            while chunk := handle.read(1 << 20):
                total += len(chunk)
    return total


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
class ShardInfo:
    """One shard, as read once before the search (pre-warmed, counted, checked)."""

    path: str
    samples: int
    bytes: int


class Source:
    """One kind of data source; subclasses override what differs."""

    names: tuple[str, ...] = ()  # the --dataset values it answers to
    summary = ""  # one line for --help and for the unknown-dataset error
    streams = False  # builds an IterableDataset: no sampler, no subset of indices
    cached = True  # a measurement process may keep the built dataset for the next trial
    ray_data = False  # Ray Data's actors can read it (raydata.rows_of): see ray_data_reads

    def matches(self, name: str) -> bool:
        return name in self.names

    def ray_data_reads(self, spec: Spec) -> bool:
        """Whether a Ray Data candidate can read this dataset (:mod:`raytune_loader.raydata`:
        image files, shards through Ray's own readers, or a map-style dataset by index)."""
        return self.ray_data

    def root(self, spec: Spec) -> Path | None:
        """Where the data is on this machine."""
        return Path(spec.data_root) if spec.data_root else None

    def prepare(self, spec: Spec, progress: Progress) -> None:
        """Make the data exist before the search reads it (generate it); most have it."""

    def build(self, spec: Spec, transfer: str = "float32", decode: str = "pil") -> Dataset:
        """The dataset read by index (map-style), with the variant's worker side."""
        raise NotImplementedError

    def accesses(self, spec: Spec) -> tuple[str, ...]:
        """How it may be read: ``map`` (by index: :meth:`build`), ``stream`` (an
        IterableDataset: :meth:`build_stream`), or either, the search choosing."""
        return ("map",)

    def batchings(self, spec: Spec) -> tuple[str, ...]:
        """Where a stream's batches may be made: by the loader, or by the stream's own
        pipeline in each worker (``workers``)."""
        return ("loader",)

    def shards(self, spec: Spec) -> list[str]:
        """A stream's shards, in their order; a DatasetError when there are none."""
        return []

    def read_shard(self, spec: Spec, path: str) -> ShardInfo:
        """Read one shard through once (pre-warming it), count its samples and check
        them; a DatasetError naming the shard and the sample when one is broken."""
        raise NotImplementedError

    def build_stream(
        self, spec: Spec, shards: list[str], variant: StreamVariant
    ) -> IterableDataset:
        """The stream over ``shards`` (all of them when empty), split by rank when it is
        iterated (the format's own splitter) and by loader worker, process or thread
        (:func:`raytune_loader.sharding.split_by_worker`)."""
        raise NotImplementedError

    def thread_workers(self, spec: Spec) -> bool:
        """Whether thread workers are a candidate: where its pipeline is searched (a
        stream must split its shards by :func:`raytune_loader.sharding.worker_share`,
        which knows threads; a stream of the user's splits by ``get_worker_info``)."""
        return self.pipeline_searched(spec)

    def describe(self, spec: Spec) -> dict[str, Any]:
        """What ``best_config.json``'s ``source`` section says about it."""
        return {"kind": self.names[0] if self.names else spec.name}

    def pipeline_searched(self, spec: Spec) -> bool:
        """Whether the search may choose how the pipeline is built (decoder, transfer,
        thread workers); otherwise the dataset's own code decodes as it does."""
        return False

    def decoders(self, spec: Spec, cuda: bool) -> tuple[str, ...]:
        """Where this source's images may be decoded (``pil``, ``tensor``, ``device``)."""
        return ("pil",)

    def files(self, dataset: Dataset, indices: list[int]) -> list[str]:
        """The files behind these samples, read once before the search (pre-warming)."""
        return []

    def num_classes(self, dataset: Dataset) -> int:
        """Classes for the model's head; 1000 when the dataset does not say."""
        base = dataset.dataset if isinstance(dataset, Subset) else dataset
        classes = getattr(base, "classes", None)
        return len(classes) if classes else 1000

    def check(self, dataset: Dataset) -> None:
        """Refuse, before any trial, samples the built-in step cannot train on: they must
        be (input, target) pairs. A sample that fails to load is left to the trials,
        which record the reason."""
        try:
            sample: Any = dataset[0]
        except Exception:  # noqa: BLE001 - the trials report it with its reason
            return
        if not isinstance(sample, (tuple, list)) or len(sample) < 2:
            raise DatasetError(
                f"samples must be (input, target) pairs; sample 0 is {type(sample).__name__}: "
                "wrap the dataset so __getitem__ returns (input, target), or train it with "
                "your own --train-step"
            )


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
    """A stream over shards of known sample counts, read as :mod:`raytune_loader.sharding`
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
        self.clock = EpochClock()  # shared with the loaders' copies (for_loader)
        self._pass = _shared(2)  # [epoch, batches worker 0 skips, worker 1's...]
        self._for_loader = False

    @property
    def batched_in_workers(self) -> bool:
        return self.batch_size is not None

    def ray_read(self) -> RayRead | None:
        """These shards as Ray Data reads them (each sample once an epoch), with this
        stream's decoder; None where Ray has no reader for them."""
        reader = self.reader.ray_reader(self.shards)
        if reader is None:
            return None
        columns = tuple(getattr(self.reader, "columns", ()))
        return RayRead(reader, self.shards, sum(self.sizes), self.decode, columns)

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
        while True:
            produced = False
            for item in self._epoch(epoch, rank, world, worker, workers, skip):
                produced = True
                yield item
            if not self.repeat or (not produced and skip == 0):
                return  # a worker without samples has none in any epoch
            epoch, skip = epoch + 1, 0

    def _epoch(
        self, epoch: int, rank: int, world: int, worker: int, workers: int, skip: int
    ) -> Iterator[Any]:
        cut = epoch_cut(sum(self.sizes), world, self.loader_batch, self.drop_last)
        low, high = worker_range(cut, self.loader_batch, worker, workers)
        start = rank * cut.per_rank
        order = shard_order(len(self.shards), self.seed, epoch, self.shuffle)
        raw: Iterator[Any] = (
            sample
            for span in spans(self.sizes, order, start + low, start + high)
            for sample in self.reader.read(self.shards[span.shard], span.start, span.stop)
        )
        if self.shuffle_buffer > 0:
            rng = random.Random(f"{self.seed}:{epoch}:{rank}:{worker}")
            raw = _shuffled(raw, self.shuffle_buffer, rng)
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
