"""What every kind of data source says about itself: the :class:`Source` contract.

A :class:`Source` is one kind of data (image folders, torchvision's sets, a user's
factory...): the ``--dataset`` names it answers to, how to make its data ready and
build it into a ``torch.utils.data.Dataset`` with a pipeline variant's worker-side
stages, and what it can do: which decoders it offers, whether the search may choose how
its pipeline is built, whether it is map-style or streams, which files to pre-warm, how
many classes it has. The rest of the package asks the source and never branches on a
dataset's name. What every source must answer is abstract: a subclass that leaves one
out cannot be made, and the error names it; what has a true default for most kinds
(a source that needs no preparation, whose data is not a stream) is said once here.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from torch.utils.data import Dataset, IterableDataset, Subset

from raytune_loader.errors import DatasetError, StoreRefusedError
from raytune_loader.loaders.shard_stream import StreamVariant

if TYPE_CHECKING:
    from raytune_loader.progress import Progress


class Spec(Protocol):
    """What a source reads of a dataset's description
    (:class:`raytune_loader.sources.datasets.DatasetSpec` is one): the sources sit below the
    module that describes datasets by name, so they name only what they read."""

    @property
    def name(self) -> str:
        """The ``--dataset`` name."""

    @property
    def data_root(self) -> str | None:
        """Where the data is (``--data-root``)."""

    @property
    def download(self) -> bool:
        """Whether torchvision may download its sets (``--download``)."""

    @property
    def synthetic_images(self) -> int:
        """How many JPEG files the default dataset has."""

    @property
    def image_column(self) -> str:
        """A table's image column."""

    @property
    def label_column(self) -> str:
        """A table's class column."""

    @property
    def shuffle_buffer(self) -> int | None:
        """A stream's shuffle buffer (None: its format's usual)."""

    @property
    def storage_options(self) -> tuple[tuple[str, str], ...]:
        """An object store client's settings beyond the environment's."""


def prewarm(files: list[str]) -> int:
    """Read each file once so every trial starts with the same page-cache state."""
    total = 0
    for name in files:
        with open(name, "rb") as handle:
            while chunk := handle.read(1 << 20):
                total += len(chunk)
    return total


@dataclass(frozen=True)
class ShardInfo:
    """One shard, as read once before the search (pre-warmed, counted, checked)."""

    path: str
    samples: int
    bytes: int


class Source(abc.ABC):
    """One kind of data source. What every kind must answer is abstract (Python names
    what a subclass left out when it is made); a source read by index also answers
    :meth:`build`, one read as a stream :meth:`shards`, :meth:`read_shard` and
    :meth:`build_stream` (the base refuses, naming the method); the rest has a default
    most kinds share."""

    names: tuple[str, ...] = ()  # the --dataset values it answers to
    summary = ""  # one line for --help and for the unknown-dataset error
    streams = False  # builds an IterableDataset: no sampler, no subset of indices
    cached = True  # a measurement process may keep the built dataset for the next trial

    def matches(self, name: str) -> bool:
        """Whether ``--dataset name`` is this source."""
        return name in self.names

    # what every source answers ---------------------------------------------------------

    @abc.abstractmethod
    def accesses(self, spec: Spec) -> tuple[str, ...]:
        """How it may be read: ``map`` (by index: :meth:`build`), ``stream`` (an
        IterableDataset: :meth:`build_stream`), or either, the search choosing."""

    @abc.abstractmethod
    def pipeline_searched(self, spec: Spec) -> bool:
        """Whether the search may choose how the pipeline is built (decoder, transfer,
        thread workers); otherwise the dataset's own code decodes as it does."""

    @abc.abstractmethod
    def decoders(self, spec: Spec, cuda: bool) -> tuple[str, ...]:
        """Where this source's images may be decoded (``pil``, ``tensor``, ``device``)."""

    @abc.abstractmethod
    def files(self, dataset: Dataset, indices: list[int]) -> list[str]:
        """The files behind these samples, read once before the search (pre-warming);
        none where they are not files of this machine (a stream pre-warms its shards)."""

    @abc.abstractmethod
    def ray_data_reads(self, spec: Spec) -> bool:
        """Whether a Ray Data candidate can read this dataset (:mod:`raytune_loader.raydata`:
        image files, shards through Ray's own readers, or a map-style dataset by index)."""

    # what a source read by index answers, and one read as a stream ---------------------

    def build(self, spec: Spec, transfer: str = "float32", decode: str = "pil") -> Dataset:
        """The dataset read by index (map-style), with the variant's worker side."""
        raise self._unanswered("build", "by index (accesses 'map')")

    def shards(self, spec: Spec) -> list[str]:
        """A stream's shards, in their order (none: a stream of the user's, which splits
        itself); a DatasetError when a format's shards are missing."""
        raise self._unanswered("shards", "as a stream (accesses 'stream')")

    def read_shard(self, spec: Spec, path: str) -> ShardInfo:
        """Read one shard through once (pre-warming it), count its samples and check
        them; a DatasetError naming the shard and the sample when one is broken."""
        raise self._unanswered("read_shard", "as a stream (accesses 'stream')")

    def build_stream(
        self, spec: Spec, shards: list[str], variant: StreamVariant
    ) -> IterableDataset:
        """The stream over ``shards`` (all of them when empty), split by rank when it is
        iterated (the format's own splitter) and by loader worker, process or thread
        (:func:`raytune_loader.loaders.sharding.split_by_worker`)."""
        raise self._unanswered("build_stream", "as a stream (accesses 'stream')")

    def _unanswered(self, method: str, read: str) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__name__}.{method}: a source read {read} must define it; "
            "see raytune_loader/sources/base.py"
        )

    # what most kinds share -------------------------------------------------------------

    def root(self, spec: Spec) -> Path | None:
        """Where the data is on this machine."""
        return Path(spec.data_root) if spec.data_root else None

    def prepare(self, spec: Spec, progress: Progress) -> None:
        """Make the data exist before the search reads it (generate it); most have it."""
        return None

    def batchings(self, spec: Spec) -> tuple[str, ...]:
        """Where a stream's batches may be made: by the loader, or by the stream's own
        pipeline in each worker (``workers``, where the format can batch)."""
        return ("loader",)

    def thread_workers(self, spec: Spec) -> bool:
        """Whether thread workers are a candidate: where its pipeline is searched (a
        stream must split its shards by :func:`raytune_loader.loaders.sharding.worker_share`,
        which knows threads; a stream of the user's splits by ``get_worker_info``)."""
        return self.pipeline_searched(spec)

    def listed(self, spec: Spec) -> Any:
        """What this process listed and counted of an object store's data (its keys, its
        shards' samples), for the job to hand to the trials' processes (the object's
        ``adopt()`` takes it there); None where nothing was listed."""
        return None

    def fetches(self, spec: Spec) -> bool:
        """Whether its samples are objects fetched from a store (each a request with a
        time to first byte): then how many a worker has in flight (``fetch_threads``) is
        searched too."""
        return False

    def describe(self, spec: Spec) -> dict[str, Any]:
        """What ``best_config.json``'s ``source`` section says about it."""
        return {"kind": self.names[0] if self.names else spec.name}

    def num_classes(self, dataset: Dataset) -> int:
        """Classes for the model's head; 1000 when the dataset does not say."""
        base = dataset.dataset if isinstance(dataset, Subset) else dataset
        classes = getattr(base, "classes", None)
        return len(classes) if classes else 1000

    def check(self, dataset: Dataset) -> None:
        """Refuse, before any trial, samples the built-in step cannot train on: they must
        be (input, target) pairs. A sample that fails to load is left to the trials,
        which record the reason (:func:`first_sample`)."""
        read, sample = first_sample(dataset)
        if read and (not isinstance(sample, (tuple, list)) or len(sample) < 2):
            raise DatasetError(
                f"samples must be (input, target) pairs; sample 0 is {type(sample).__name__}: "
                "wrap the dataset so __getitem__ returns (input, target), or train it with "
                "your own --train-step"
            )


def first_sample(dataset: Dataset) -> tuple[bool, Any]:
    """(True, sample 0), or (False, None) where it fails to load: the trials record the
    reason. A store that refuses the read (a bucket anyone may list whose objects these
    credentials may not read) would refuse every trial's: its StoreRefusedError is
    raised here, before any trial."""
    try:
        return True, dataset[0]
    except StoreRefusedError:
        raise
    except Exception:  # noqa: BLE001 - the trials report it with its reason
        return False, None
