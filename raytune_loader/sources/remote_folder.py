"""Image folders in an object store: the ImageFolder layout under ``s3://bucket/prefix``.

The bucket is listed once (:func:`listing`, one request per thousand keys) and the
listing handed on: to the trials through the job, to loader workers and Ray Data's
actors inside the dataset. :class:`RemoteImageFolder` reads each sample's object where
it lives, as training does: nothing is pre-read. A batch's objects are fetched
together by ``fetch_threads`` threads of the worker that makes it (``__getitems__``,
which the DataLoader calls with a batch's indices): the requests in flight that set
the rate against a store's latency, where cores set it against a disk.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset

from raytune_loader.errors import CorruptSampleError, DatasetError
from raytune_loader.pipeline.transforms import worker_image
from raytune_loader.stores.store import Counts, Store
from raytune_loader.stores.url import StoreUrl, parse

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_LISTINGS: dict[tuple[str, tuple[tuple[str, str], ...]], Listing] = {}  # this process's


@dataclass(frozen=True)
class Listing:
    """An image folder's objects as listed once: the folder's URL, its classes (the
    first level of keys under it) and every image's key with its class index."""

    url: str
    classes: tuple[str, ...]
    samples: tuple[tuple[str, int], ...]
    bytes: int

    @property
    def mean_object_bytes(self) -> float:
        """The images' mean size (the profile's figure for what a request carries)."""
        return self.bytes / max(1, len(self.samples))


def listing(url: StoreUrl, options: Mapping[str, str]) -> Listing:
    """The image folder at ``url``, listed once per process (a second call, or one after
    :func:`remember`, lists nothing); a DatasetError in one line where it holds no image
    in the ``<class>/<image>`` layout."""
    cache = (str(url), tuple(sorted(options.items())))
    if cache not in _LISTINGS:
        store = Store(url, options)
        store.check()
        found, classes, size = [], set(), 0
        for key, nbytes in store.list():
            rest = key[len(url.prefix) :].lstrip("/") if url.prefix else key
            parts = rest.split("/")
            if len(parts) == 2 and parts[1].lower().endswith(IMAGE_SUFFIXES):
                found.append((key, parts[0]))
                classes.add(parts[0])
                size += nbytes
        if not found:
            raise DatasetError(
                f"no images under {url} in the ImageFolder layout {url}/<class>/<image>.JPEG"
            )
        order = sorted(classes)
        index = {name: i for i, name in enumerate(order)}
        samples = tuple((key, index[name]) for key, name in found)
        _LISTINGS[cache] = Listing(str(url), tuple(order), samples, size)
    return _LISTINGS[cache]


def remember(found: Listing, options: Mapping[str, str]) -> None:
    """Take a listing made elsewhere (the search's driver) as this process's own."""
    _LISTINGS[(found.url, tuple(sorted(options.items())))] = found


class RemoteImageFolder(Dataset):  # type: ignore[type-arg]
    """The images of a :class:`Listing`, each read from the store when asked for and made
    into the pipeline variant's worker-side sample (:func:`worker_image`)."""

    def __init__(
        self,
        found: Listing,
        options: Mapping[str, str],
        transfer: str = "float32",
        decode: str = "pil",
        fetch_threads: int = 1,
    ) -> None:
        self.listing = found
        self.classes = list(found.classes)
        self.targets = [label for _, label in found.samples]
        self.store = Store(parse(found.url), dict(options))
        self.transfer, self.decode = transfer, decode
        self.fetch_threads = fetch_threads
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"], state["_pool_lock"] = None, None  # each process its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pool_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.listing.samples)

    def count(self, counts: Counts | None) -> None:
        """Count this dataset's requests and retries into ``counts`` (a measurement's)."""
        self.store.counts = counts

    def __getitem__(self, index: int) -> tuple[Any, int]:
        key, label = self.listing.samples[index]
        return self._made(key, self.store.get(key)), label

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, int]]:
        """A batch's samples, their objects fetched ``fetch_threads`` at a time."""
        keys = [self.listing.samples[i][0] for i in indices]
        if self.fetch_threads <= 1 or len(keys) == 1:
            blobs = [self.store.get(key) for key in keys]
        else:
            blobs = list(self._threads().map(self.store.get, keys))
        return [(self._made(key, blob), self.listing.samples[i][1])
                for i, key, blob in zip(indices, keys, blobs, strict=True)]  # fmt: skip

    def _threads(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None or self._pool._max_workers != self.fetch_threads:  # type: ignore[attr-defined]
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(self.fetch_threads, "raytune-fetch")
            return self._pool

    def _made(self, key: str, blob: bytes) -> Any:
        try:
            return worker_image(blob, self.transfer, self.decode)
        except CorruptSampleError as exc:
            raise CorruptSampleError(f"corrupt sample {self.store.url.of(key)}: {exc}") from None

