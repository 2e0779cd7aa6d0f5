"""What a measurement reads: from a ``--dataset`` name, through its source, to a Dataset.

A :class:`DatasetSpec` is small and picklable: every trial rebuilds its dataset from
it in its own process. The kinds of data and what each can do live in
:mod:`raytune_loader.sources` (one module per kind, one registry); this module asks
the spec's source and never branches on a name. Missing or empty data raises
:class:`~raytune_loader.errors.DatasetError` saying how to get it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from raytune_loader import sources
from raytune_loader.errors import DatasetError
from raytune_loader.progress import Progress
from raytune_loader.sources import Source, synthetic
from raytune_loader.sources.base import first_sample
from raytune_loader.sources.remote_folder import Listing, remember
from raytune_loader.stores.store import StoreOptions

SYNTHETIC = sources.DEFAULT


@dataclass(frozen=True)
class DatasetSpec:
    """What to load; rebuilt into a Dataset inside each trial."""

    name: str
    data_root: str | None = None
    download: bool = False
    synthetic_images: int = synthetic.DEFAULT_IMAGES
    image_column: str = "image"  # tables (Hugging Face datasets, Parquet): the image
    label_column: str = "label"  # and the class
    shuffle_buffer: int | None = None  # a stream's shuffle buffer; None: its format's usual
    # an object store's settings beyond the environment's (--storage-options: region,
    # endpoint_url, profile, force_path_style, unsigned); never a credential
    storage_options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        sources.source_for(self.name)  # an unknown name is a DatasetError listing the known

    @property
    def source(self) -> Source:
        """The source its name answers to (a DatasetError for an unknown name)."""
        return sources.source_for(self.name)

    @property
    def slug(self) -> str:
        """Folder name for this dataset's results."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name).strip("-")

    def resolved_root(self) -> Path | None:
        """Where its data is on this machine."""
        return self.source.root(self)


def prepare(spec: DatasetSpec, progress: Progress) -> None:
    """Make the data exist (the embedded default is generated on first use)."""
    spec.source.prepare(spec, progress)


def build_dataset(
    spec: DatasetSpec, transfer: str = "float32", decode: str = "pil"
) -> Dataset[Any]:
    """The full dataset named by ``spec``, with the worker-side stages of ``transfer``
    and ``decode`` where its source lets the pipeline be searched."""
    dataset = spec.source.build(spec, transfer, decode)
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise DatasetError(f"dataset {spec.name} is empty")
    return dataset


@functools.lru_cache(maxsize=8)
def _kept(spec: DatasetSpec, transfer: str, decode: str) -> Dataset[Any]:
    return build_dataset(spec, transfer, decode)


def dataset_for_trial(
    spec: DatasetSpec, transfer: str = "float32", decode: str = "pil"
) -> Dataset[Any]:
    """The dataset a measurement reads, kept across trials that Ray runs in one reused
    process where its source allows (a stateless list of files or arrays: listing
    ImageNet's 1.28M files takes seconds); otherwise built every time."""
    if spec.source.cached:
        return _kept(spec, transfer, decode)
    return build_dataset(spec, transfer, decode)


def num_classes(spec: DatasetSpec, dataset: Dataset[Any]) -> int:
    """Classes for the model's head; 1000 when the dataset does not say."""
    return spec.source.num_classes(dataset)


def listing_of(dataset: Dataset[Any]) -> Any:
    """What building ``dataset`` listed (an object store's keys), to hand to the other
    processes that build it (:func:`adopt_listing`); None where it listed nothing."""
    found = getattr(dataset, "listing", None)
    return found if isinstance(found, Listing) else None


def adopt_listing(spec: DatasetSpec, found: Any) -> None:
    """Take ``found`` (:func:`listing_of`, in another process) as this process's listing
    of ``spec``'s store: building the dataset here lists nothing."""
    if isinstance(found, Listing):
        remember(found, StoreOptions.from_pairs(spec.storage_options))
    elif found is not None:  # another source's (a store's shards): it knows its own
        found.adopt()


def subset_indices(length: int, count: int, seed: int, slot: int = 0) -> list[int]:
    """The samples a trial reads: slot 0 is the fixed, pre-warmed subset every trial
    shares; with ``--cold``, slot k is the k-th disjoint block of one permutation, so no
    trial reads what an earlier one read (until the dataset is used up and wraps)."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(length, generator=generator)
    count = min(count, length)
    start = (slot * count) % length
    return order.roll(-start)[:count].tolist()


def sample_files(spec: DatasetSpec, dataset: Dataset[Any], indices: list[int]) -> list[str]:
    """Files behind the given samples, where the source reads files."""
    return spec.source.files(dataset, indices)


def check_sample(spec: DatasetSpec, dataset: Dataset[Any], pairs: bool = True) -> None:
    """Refuse, before any trial, samples the built-in step cannot train on (where
    ``pairs``: the source's check), and a store that refuses the first sample's read."""
    if pairs:
        spec.source.check(dataset)
    else:
        first_sample(dataset)
