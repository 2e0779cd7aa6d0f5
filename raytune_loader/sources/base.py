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

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.data import Dataset, Subset

from raytune_loader.errors import DatasetError

if TYPE_CHECKING:
    from raytune_loader.datasets import DatasetSpec
    from raytune_loader.progress import Progress


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
        raise NotImplementedError

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
