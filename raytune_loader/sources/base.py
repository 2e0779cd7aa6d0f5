"""What every kind of data source says about itself, and its defaults.

A :class:`Source` is one kind of data (image folders, torchvision's sets, a user's
factory...): the ``--dataset`` names it answers to, how to make its data ready and
build it into a ``torch.utils.data.Dataset`` with a pipeline variant's worker-side
stages, and what it can do: which decoders it offers, whether the search may
choose how its pipeline is built, whether it is map-style or streams, which files
to pre-warm, how many classes it has. The rest of the package asks the source and
never branches on a dataset's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.data import Dataset, IterableDataset, Subset

from raytune_loader.errors import DatasetError

if TYPE_CHECKING:
    from raytune_loader.datasets import DatasetSpec
    from raytune_loader.progress import Progress


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

    def matches(self, name: str) -> bool:
        return name in self.names

    def root(self, spec: DatasetSpec) -> Path | None:
        """Where the data is on this machine."""
        return Path(spec.data_root) if spec.data_root else None

    def prepare(self, spec: DatasetSpec, progress: Progress) -> None:
        """Make the data exist before the search reads it (generate it); most have it."""

    def build(self, spec: DatasetSpec, transfer: str = "float32", decode: str = "pil") -> Dataset:
        """The dataset read by index (map-style), with the variant's worker side."""
        raise NotImplementedError

    def accesses(self, spec: DatasetSpec) -> tuple[str, ...]:
        """How it may be read: ``map`` (by index: :meth:`build`), ``stream`` (an
        IterableDataset: :meth:`build_stream`), or either, the search choosing."""
        return ("map",)

    def batchings(self, spec: DatasetSpec) -> tuple[str, ...]:
        """Where a stream's batches may be made: by the loader, or by the stream's own
        pipeline in each worker (``workers``)."""
        return ("loader",)

    def shards(self, spec: DatasetSpec) -> list[str]:
        """A stream's shards, in their order; a DatasetError when there are none."""
        return []

    def read_shard(self, spec: DatasetSpec, path: str) -> ShardInfo:
        """Read one shard through once (pre-warming it), count its samples and check
        them; a DatasetError naming the shard and the sample when one is broken."""
        raise NotImplementedError

    def build_stream(
        self, spec: DatasetSpec, shards: list[str], variant: StreamVariant
    ) -> IterableDataset:
        """The stream over ``shards`` (all of them when empty), split by rank when it is
        iterated (the format's own splitter) and by loader worker, process or thread
        (:func:`raytune_loader.sharding.split_by_worker`)."""
        raise NotImplementedError

    def thread_workers(self, spec: DatasetSpec) -> bool:
        """Whether thread workers are a candidate: where its pipeline is searched (a
        stream must split its shards by :func:`raytune_loader.sharding.worker_share`,
        which knows threads; a stream of the user's splits by ``get_worker_info``)."""
        return self.pipeline_searched(spec)

    def describe(self, spec: DatasetSpec) -> dict[str, Any]:
        """What ``best_config.json``'s ``source`` section says about it."""
        return {"kind": self.names[0] if self.names else spec.name}

    def pipeline_searched(self, spec: DatasetSpec) -> bool:
        """Whether the search may choose how the pipeline is built (decoder, transfer,
        thread workers); otherwise the dataset's own code decodes as it does."""
        return False

    def decoders(self, spec: DatasetSpec, cuda: bool) -> tuple[str, ...]:
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
