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

import logging
import zlib
from array import array
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import Dataset

from raytune_loader.errors import CorruptSampleError, DatasetError
from raytune_loader.pipeline.transforms import worker_image
from raytune_loader.stores.cache import ObjectCache, default_budget, default_folder
from raytune_loader.stores.pools import FetchPools
from raytune_loader.stores.store import Store, StoreOptions
from raytune_loader.stores.url import StoreUrl, is_remote, parse
from raytune_loader.wrapped import wrapped

log = logging.getLogger(__name__)
LIST_THREADS = 16  # class folders listed at once
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_LISTINGS: dict[tuple[str, StoreOptions], Listing] = {}  # this process's


@dataclass(frozen=True)
class Listing:
    """An image folder's objects as listed once: the folder's URL, its classes (the
    first level of keys under it), every image's key with its class index, and their
    bytes (what an epoch reads)."""

    url: str
    classes: tuple[str, ...]
    samples: tuple[tuple[str, int], ...]
    bytes: int = 0
    # each image's version: a CRC-32 of its ETag (4 bytes a key, not its 34 characters),
    # which names its copy in a local cache; empty where the listing had none
    versions: array[int] = field(default_factory=lambda: array("L"))

    def version(self, index: int) -> int:
        """The version of sample ``index``'s object as listed (0 where none was)."""
        return self.versions[index] if index < len(self.versions) else 0


def listing(url: StoreUrl, options: StoreOptions) -> Listing:
    """The image folder at ``url``, listed once per process (a second call, or one after
    :func:`remember`, lists nothing): its class folders with one delimited listing, then
    each class's keys, :data:`LIST_THREADS` classes at once (ImageNet's 1.28 million
    keys are 1,300 listing requests, 1,000 classes listed side by side); a DatasetError
    in one line where it holds no image in the ``<class>/<image>`` layout."""
    cache = (str(url), options)
    if cache in _LISTINGS:
        return _LISTINGS[cache]
    store = Store(url, options)
    store.check()
    classes = [folder.rsplit("/", 1)[-1] for folder in store.folders()]
    with ThreadPoolExecutor(LIST_THREADS, "raytune-list") as pool:
        listed = list(pool.map(lambda name: store.list(name), classes))
    samples: list[tuple[str, int]] = []
    versions = array("L")
    total = 0
    for index, found in enumerate(listed):
        kept = [(key, size, tag) for key, size, tag in found
                if key.lower().endswith(IMAGE_SUFFIXES)
                and "/" not in key[len(url.key(classes[index])) + 1 :]]  # fmt: skip
        samples += [(key, index) for key, _, _ in kept]
        versions.extend(zlib.crc32(tag.encode()) for _, _, tag in kept)
        total += sum(size for _, size, _ in kept)
    if not samples:
        raise DatasetError(
            f"no images under {url} in the ImageFolder layout {url}/<class>/<image>.JPEG"
        )
    _LISTINGS[cache] = Listing(str(url), tuple(classes), tuple(samples), total, versions)
    log.info("listed %s: %d images in %d classes", url, len(samples), len(classes))
    return _LISTINGS[cache]


def remember(found: Listing, options: StoreOptions) -> None:
    """Take a listing made elsewhere (the search's driver) as this process's own."""
    _LISTINGS[(found.url, options)] = found


class RemoteImageFolder(Dataset):  # type: ignore[type-arg]
    """The images of a :class:`Listing`, each read from the store when asked for and made
    into the pipeline variant's worker-side sample (:func:`worker_image`)."""

    def __init__(
        self,
        found: Listing,
        options: StoreOptions,
        transfer: str = "float32",
        decode: str = "pil",
        fetch_threads: int = 1,
    ) -> None:
        self.listing = found
        self.classes = list(found.classes)
        self.targets = [label for _, label in found.samples]
        self.store = Store(parse(found.url), options)
        self.transfer, self.decode = transfer, decode
        self.fetch_threads = fetch_threads
        self.cache: ObjectCache | None = None  # set by the loader for a cache candidate
        self._pools = FetchPools("raytune-fetch")  # each worker's own, threads' too

    def __len__(self) -> int:
        return len(self.listing.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        key, label = self.listing.samples[index]
        return self._made(key, self._get(index)), label

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, int]]:
        """A batch's samples, their objects fetched ``fetch_threads`` at a time."""
        keys = [self.listing.samples[i][0] for i in indices]
        if self.fetch_threads <= 1 or len(keys) == 1:
            blobs = [self._get(i) for i in indices]
        else:
            blobs = list(self._pools.get(self.fetch_threads).map(self._get, indices))
        return [(self._made(key, blob), self.listing.samples[i][1])
                for i, key, blob in zip(indices, keys, blobs, strict=True)]  # fmt: skip

    def keep_objects(self, on: bool, cache: ObjectCache | None = None) -> None:
        """Keep the objects read in a local cache (``cache``, else one already given, else
        the default folder under half its disk's free bytes), or read every one from
        the store (``on`` false)."""
        if not on:
            self.cache = None
        elif cache is not None or self.cache is None:
            self.cache = cache or ObjectCache(default_folder(), default_budget(default_folder()))

    def _get(self, index: int) -> bytes:
        """Sample ``index``'s object: from the local cache where there is one (its copy of
        the version listed), else the store."""
        key = self.listing.samples[index][0]
        if self.cache is None:
            return self.store.get(key)
        return self.cache.get(self.store, key, self.listing.version(index))

    def _made(self, key: str, blob: bytes) -> Any:
        try:
            return worker_image(blob, self.transfer, self.decode)
        except CorruptSampleError as exc:
            raise CorruptSampleError(f"corrupt sample {self.store.url.of(key)}: {exc}") from None


def keys_of(dataset: Any) -> list[str]:
    """The object keys ``dataset`` (or a dataset it wraps) reads from its store, in its
    order: a remote folder's images (the samples a Subset picked first), or a stream's
    shards; none for local data."""
    indices = None
    for layer in wrapped(dataset):
        shards = getattr(layer, "shards", None)
        if isinstance(shards, Sequence) and shards and is_remote(shards[0]):
            return [parse(url).prefix for url in shards]
        if isinstance(layer, RemoteImageFolder):
            samples = layer.listing.samples
            return [
                samples[i][0] for i in (indices if indices is not None else range(len(samples)))
            ]
        if indices is None and isinstance(getattr(layer, "indices", None), Sequence):
            indices = list(layer.indices)
    return []
