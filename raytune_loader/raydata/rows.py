"""A source as the rows a pipeline's actors read.

:func:`rows_of` says what the actors read of a measurement's dataset: an image folder's
(file, class) rows, a stream's shards through Ray's own reader (webdataset tar shards,
Parquet files), or any map-style dataset by index (:class:`ByIndex`);
:func:`epoch_order` and :func:`shard_passes` give an epoch's seeded order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raytune_loader.errors import DatasetError

if TYPE_CHECKING:
    from torch.utils.data import Dataset as TorchDataset

    from raytune_loader.loaders.shard_stream import RayRead
log = logging.getLogger(__name__)


# The source as rows -----------------------------------------------------------------------


def image_rows(dataset: TorchDataset[Any]) -> list[tuple[str, int]]:
    """The (file, class) rows of an image-folder dataset (``ImageFolder``, or a ``Subset``
    of one: the trial's samples): what the actors read."""
    from torch.utils.data import Subset

    indices: Sequence[int] | None = None
    while isinstance(dataset, Subset):
        inner = list(dataset.indices)
        indices = inner if indices is None else [inner[i] for i in indices]
        dataset = dataset.dataset
    samples = getattr(dataset, "samples", None)
    if not samples:
        raise DatasetError(
            f"{type(dataset).__name__} is not an image folder: a Ray Data candidate reads "
            "the synthetic-imagenet, imagenet and imagefolder sources"
        )
    chosen = range(len(samples)) if indices is None else indices
    return [(str(samples[i][0]), int(samples[i][1])) for i in chosen]


@dataclass(frozen=True)
class ByIndex:
    """A map-style dataset read by index: the rows are its indices, and each actor holds
    the dataset (pickled once, into the actor) and calls ``dataset[i]``, as a DataLoader
    worker does, so its samples are the worker side of the variant it was built with."""

    dataset: TorchDataset[Any]


def rows_of(dataset: TorchDataset[Any]) -> Sequence[tuple[str, int]] | ByIndex | RayRead:
    """What the actors read of a measurement's dataset: an image folder's (file, class)
    rows (:func:`image_rows`, the trial's subset); a stream's shards through Ray's own
    reader (:meth:`~raytune_loader.sources.base.ShardStream.ray_read`: webdataset tar
    shards, Parquet files); a table's Parquet files (``--dataset hf``, the whole table:
    ``read_parquet`` reads files, not rows by index); otherwise the map-style dataset by
    index (:class:`ByIndex`). A stream of the user's cannot be read: a DatasetError."""
    from torch.utils.data import IterableDataset, Subset

    from raytune_loader.loaders.shard_stream import ShardStream

    base = dataset
    while isinstance(base, Subset):
        base = base.dataset
    if getattr(base, "samples", None):
        return image_rows(dataset)
    if isinstance(base, ShardStream):
        read = base.ray_read()
        if read is None:
            raise DatasetError(
                "Ray Data has no reader of these shards (save_to_disk's Arrow files as a "
                "stream): read them map-style, or pass --no-ray-data"
            )
        return read
    ray_read = getattr(base, "ray_read", None)
    read = ray_read() if callable(ray_read) else None
    if read is not None:
        return read
    if isinstance(base, IterableDataset) or not hasattr(base, "__len__"):
        raise DatasetError(
            f"{type(base).__name__} is a stream: Ray Data's actors read a map-style dataset "
            "by index (a Hugging Face streaming dataset from the Hub is one such stream); "
            "return a map-style dataset (save it locally, or read its Parquet files with "
            "--dataset hf), or pass --no-ray-data"
        )
    return ByIndex(dataset)


def epoch_order(count: int, samples: int | None, seed: int) -> list[int]:
    """Indices of ``count`` rows for one epoch of ``samples`` (default: each row once):
    seeded permutations, one after another, cut to length (a segment reads its subset
    reshuffled as often as it needs, as the DataLoader path's sampler does)."""
    import torch

    wanted = count if samples is None else samples
    order: list[int] = []
    draw = 0
    while len(order) < wanted:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + draw)
        order += torch.randperm(count, generator=generator).tolist()
        draw += 1
    return order[:wanted]


def shard_passes(paths: Sequence[str], passes: int, seed: int) -> list[str]:
    """``paths`` listed ``passes`` times, each pass in its own seeded order (as
    :func:`epoch_order` lists rows): a segment longer than the shards reads every file
    once before any twice, but where Ray's read tasks finish out of order, at the edges
    of a pass."""
    return [paths[i] for i in epoch_order(len(paths), passes * len(paths), seed)]
