"""What Ray Data's actors run: a pipeline variant's worker side, row by row.

Each actor holds a :class:`SampleMaker` (a stateful pool): a map call's rows (an image
folder's files, a shard's members, a dataset's indices) made into the samples a
DataLoader worker makes for the same variant (:func:`make_samples`), each stamped with
when its making started and ended, with what the actor said of its memory.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytune_loader.errors import CorruptSampleError
from raytune_loader.stores.store import Counts, store_of

if TYPE_CHECKING:
    import numpy as np
    from torch.utils.data import Dataset as TorchDataset

log = logging.getLogger(__name__)


# The actors' side -------------------------------------------------------------------------

RowDecoder = Callable[[dict[str, Any]], tuple[Any, int]]  # a row's columns -> (sample, class)
# what a map call asked of a store (Counts' names): the call's totals in its first row,
# so that any batch cut across calls sums each call's once
STORE_COLUMNS = tuple(f"_store_{name}" for name in Counts.NAMES)


def make_samples(
    batch: Mapping[str, Any], transfer: str, decode: str, decoded: RowDecoder | None = None
) -> dict[str, Any]:
    """A map call's rows made into samples as a DataLoader worker makes them: each row
    (a dict of its columns) through ``decoded``, the source's decoder of the variant
    (default: rows ``path``, ``label`` of image files, each file read and passed through
    :func:`~raytune_loader.pipeline.transforms.worker_image`), with when each row's making started
    and ended (the stacking counted in the last row's); a store's objects the call's
    rows fetched together (:meth:`Indexed.together`), each row's time holding its share
    of the call's wait, and what the call asked of the store (:data:`STORE_COLUMNS`:
    the actor's requests are made in its own process, uncounted by the trial's).
    Images cross as one (N, 3, 224, 224) array; encoded files as bytes."""
    import numpy as np

    decoded = decoded or FileImage(transfer, decode)
    made_list: list[Any] = []
    labels: list[int] = []
    started, made = [], []
    rows = [_row(batch, index) for index in range(len(next(iter(batch.values()))))]
    call_started = time.monotonic()
    counts = decoded.counts() if isinstance(decoded, Indexed) else None
    asked_before = counts.totals() if counts is not None else None
    # a store's objects: the call's fetched at once (None: each row made on its own)
    together = decoded.together(rows) if isinstance(decoded, Indexed) else None
    # the call's wait shared by its rows, so that their times add up to the call's
    # (a batch's cost is its rows' sum) and a batch cut across calls gets its share
    share = (time.monotonic() - call_started) / max(1, len(rows)) if together else 0.0
    for index, row in enumerate(rows):
        started.append(time.monotonic() - share)
        sample, label = decoded(row) if together is None else together[index]
        made_list.append(sample.numpy().tobytes() if decode == "device" else _array(sample))
        labels.append(int(label))
        made.append(time.monotonic())
    images: np.ndarray = (
        np.array(made_list, dtype=object) if decode == "device" else np.stack(made_list)
    )
    made[-1] = time.monotonic()
    count = len(made)
    out = {"image": images, "label": np.asarray(labels, dtype=np.int64),
           "_started": np.array(started), "_made": np.array(made),
           "_rss": np.full(count, _resident()), "_free": np.full(count, _available())}  # fmt: skip
    if counts is not None and asked_before is not None:
        after = counts.totals()
        for column, name in zip(STORE_COLUMNS, Counts.NAMES, strict=True):
            out[column] = np.zeros(count, dtype=np.int64)
            out[column][0] = after[name] - asked_before[name]
    return out


def _row(batch: Mapping[str, Any], index: int) -> dict[str, Any]:
    """One row of a numpy batch as the sources' decoders read a sample: Python scalars,
    without the cells a reader left empty (a webdataset sample without that member)."""
    import numpy as np

    row: dict[str, Any] = {}
    for name, values in batch.items():
        value = values[index]
        if isinstance(value, np.generic):
            value = value.item()
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        row[name] = value
    return row


def _array(sample: Any) -> Any:
    import numpy as np

    return sample.numpy() if hasattr(sample, "numpy") else np.asarray(sample)


@dataclass(frozen=True)
class FileImage:
    """An image-folder row (``path``, ``label``) as the variant's sample: the file read
    and passed through :func:`~raytune_loader.pipeline.transforms.worker_image`."""

    transfer: str
    decode: str

    def __call__(self, row: dict[str, Any]) -> tuple[Any, int]:
        from raytune_loader.pipeline.transforms import worker_image

        path = str(row["path"])
        try:
            return worker_image(Path(path).read_bytes(), self.transfer, self.decode), row["label"]
        except CorruptSampleError as exc:
            raise CorruptSampleError(f"corrupt sample {path}: {exc}") from None


@dataclass(frozen=True)
class Indexed:
    """A :class:`ByIndex` row (``index``) as the dataset's own sample. A dataset that
    fetches a batch's objects from a store (``__getitems__``, ``fetch_threads`` at a
    time) has a map call's fetched ``in_flight`` at a time (:meth:`together`), as a
    DataLoader worker fetches its batch's, where one at a time each row waited for its
    request."""

    dataset: TorchDataset[Any]
    in_flight: int = 1

    def __call__(self, row: dict[str, Any]) -> tuple[Any, int]:
        sample, label = self.dataset[int(row["index"])][:2]
        return sample, label

    def counts(self) -> Counts | None:
        """The requests this actor's copy of the dataset makes, counted in this process
        (a count of its own from the first call: a copy's is not the trial's); None where
        it reads no store."""
        store = store_of(self.dataset)
        if store is None:
            return None
        if store.counts is None:
            store.counts = Counts()
        return store.counts

    def together(self, rows: list[dict[str, Any]]) -> list[tuple[Any, int]] | None:
        """The rows' samples from one ``__getitems__`` of the actor's own copy of the
        dataset, its requests ``in_flight`` at once; None where the dataset fetches
        nothing (the rows are then made one at a time)."""
        from raytune_loader.loaders.batches import fetch_threads_of, set_fetch_threads

        many = getattr(self.dataset, "__getitems__", None)
        if self.in_flight <= 1 or fetch_threads_of(self.dataset) is None or many is None:
            return None
        set_fetch_threads(self.dataset, self.in_flight)
        found = many([int(row["index"]) for row in rows])
        return [(sample, label) for sample, label, *_ in found]


def _resident() -> int:
    """This process's resident bytes (an actor's, as it hands a map call over)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def _available() -> int:
    """This node's available memory."""
    import psutil

    return int(psutil.virtual_memory().available)


class SampleMaker:
    """The callable class the actors run (one per actor, so a stateful pool): the
    variant's :func:`make_samples`, with torch's threads held to the actor's CPUs (one,
    as in a DataLoader worker, for one CPU)."""

    def __init__(
        self, transfer: str, decode: str, threads: int, decoded: RowDecoder | None = None
    ) -> None:
        import torch

        torch.set_num_threads(threads)
        self.transfer, self.decode, self.decoded = transfer, decode, decoded

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        return make_samples(batch, self.transfer, self.decode, self.decoded)
