"""WebDataset tar shards: ``--dataset webdataset --data-root DIR`` or a brace pattern.

A folder of ``.tar`` shards, or a pattern such as ``/data/shards-{0000..0127}.tar``,
read with the maintained ``webdataset`` package (``pip install webdataset``). Each
sample has an image under one of the keys ``jpg``, ``jpeg``, ``png`` or ``webp`` and
its class under ``cls``, as webdataset names them, and gets the ImageNet training
transforms of the chosen pipeline variant (decoded by PIL or to tensors in the
workers, or, JPEGs, on the device). Shards are read as :class:`ShardStream` plans
them (:mod:`raytune_loader.loaders.sharding`): every rank its own contiguous share of the
epoch's shard order, cut by sample so that every rank reads the same number of
batches, each loader worker (process or thread) whole batches of it. A sample is
webdataset's: the files of one key in a row, the key and extension split by
webdataset's own rule; a span that starts inside a shard seeks past the members
before it. Samples pass a shuffle buffer (``--shuffle-buffer``, the shards' order
shuffled too) as training would; the buffer is the user's, never shrunk (a trial's
holds at most a worker's pass over its shards: :class:`ShardStream`). Batches
are made by the loader or in each worker, a searched choice.

Shards in an object store (``s3://bucket/shards-{0000..0127}.tar``, or a prefix whose
``.tar`` objects are the shards) are read where they live: each span's shard fetched
whole by one GET through :class:`~raytune_loader.stores.store.Store` (retried and
counted as every request is), and ``fetch_threads`` shards fetched ahead in each worker
while the current one is decoded (the read-ahead that hides a store's latency).
A brace pattern is expanded without a request; a prefix is listed once per process.
"""

from __future__ import annotations

import collections
import glob
import io
import itertools
import os
import re
import tarfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset, IterableDataset, default_collate

from raytune_loader.errors import CorruptSampleError, DatasetError, last_line
from raytune_loader.loaders.shard_stream import ShardStream, StreamVariant
from raytune_loader.pipeline.transforms import worker_image
from raytune_loader.sources.base import ShardInfo, Source, Spec
from raytune_loader.stores.store import Store, StoreOptions
from raytune_loader.stores.url import StoreUrl, is_remote, parse

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
LABEL_KEY = "cls"
INSTALL = "pip install webdataset"
_LISTED: dict[tuple[str, StoreOptions], tuple[str, ...]] = {}  # this process's prefixes
_COUNTED: dict[str, int] = {}  # a store's shard URL -> its samples, counted in this process


@dataclass(frozen=True)
class ShardListing:
    """What the search's driver learned of shards in a store (their URLs, the samples of
    those it counted), handed to the trials' processes in the job so that they list and
    count nothing again (a count is a whole shard's GET)."""

    root: str
    options: StoreOptions
    shards: tuple[str, ...]
    counted: tuple[tuple[str, int], ...]

    def adopt(self) -> None:
        """Take it as this process's own."""
        _LISTED[(self.root, self.options)] = self.shards
        _COUNTED.update(self.counted)


def _webdataset() -> Any:
    try:
        import webdataset
    except ImportError:
        raise DatasetError(
            f"--dataset webdataset needs the webdataset package: {INSTALL}"
        ) from None
    return webdataset


class WebDatasetShards(Source):
    """WebDataset tar shards, read as a stream split by sample across ranks and workers."""

    names = ("webdataset",)
    summary = "tar shards under --data-root, or a brace pattern shards-{0000..0127}.tar"
    cached = False

    def accesses(self, spec: Spec) -> tuple[str, ...]:
        return ("stream",)

    def batchings(self, spec: Spec) -> tuple[str, ...]:
        return ("loader", "workers")

    def ray_data_reads(self, spec: Spec) -> bool:
        # the trial's shards through ray.data.read_webdataset (ShardStream.ray_read); shards
        # in a bucket are read by the DataLoader candidates only
        return not is_remote(spec.data_root)

    def fetches(self, spec: Spec) -> bool:
        return is_remote(spec.data_root)

    def files(self, dataset: Dataset, indices: list[int]) -> list[str]:
        return []  # its shards are pre-warmed as they are counted (measuring.shards)

    def pipeline_searched(self, spec: Spec) -> bool:
        return True

    def shards(self, spec: Spec) -> list[str]:
        if not spec.data_root:
            raise DatasetError(
                "webdataset needs --data-root: a folder of .tar shards, or a pattern "
                "like /data/shards-{0000..0127}.tar"
            )
        root = spec.data_root
        if is_remote(root):
            return list(_remote_shards(root, StoreOptions.from_pairs(spec.storage_options)))
        if Path(root).is_dir():
            found = sorted(glob.glob(os.path.join(root, "*.tar")))
        else:
            found = [p for p in _webdataset().shardlists.expand_urls(root) if Path(p).is_file()]
        if not found:
            raise DatasetError(f"webdataset: {root} matches no .tar shard")
        return found

    def listed(self, spec: Spec) -> ShardListing | None:
        """For shards in a store: what this process listed and counted, to hand on."""
        if not is_remote(spec.data_root):
            return None
        options = StoreOptions.from_pairs(spec.storage_options)
        shards = _remote_shards(str(spec.data_root), options)
        counted = tuple((url, _COUNTED[url]) for url in shards if url in _COUNTED)
        return ShardListing(str(spec.data_root), options, shards, counted)

    def decoders(self, spec: Spec, cuda: bool) -> tuple[str, ...]:
        found = ("pil", "tensor")
        if not cuda:
            return found
        first = _first_image(self.shards(spec)[0], _store(spec))
        return (*found, "device") if first[:3] == b"\xff\xd8\xff" else found

    def read_shard(self, spec: Spec, path: str) -> ShardInfo:
        samples: dict[str, set[str]] = {}
        member = "its first member"
        store = _store(spec)
        blob = _fetched(store, path) if store is not None else None
        try:
            with _tar(path, blob, stream=True) as tar:
                for entry in tar:
                    member = entry.name
                    if entry.isfile():
                        key, _, ext = _split(entry.name)
                        samples.setdefault(key, set()).add(ext)
                        tar.extractfile(entry).read()  # type: ignore[union-attr]
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DatasetError(
                f"webdataset: shard {path} is truncated or not a tar file after {member} "
                f"({last_line(exc)}); rewrite it or leave it out"
            ) from None
        for key, exts in samples.items():
            if not exts & set(IMAGE_KEYS) or LABEL_KEY not in exts:
                missing = LABEL_KEY if exts & set(IMAGE_KEYS) else "/".join(IMAGE_KEYS)
                raise DatasetError(
                    f"webdataset: shard {path}, sample {key}, has no {missing} "
                    f"(it has {', '.join(sorted(exts)) or 'nothing'}); every sample needs an "
                    f"image ({', '.join(IMAGE_KEYS)}) and a {LABEL_KEY}"
                )
        if blob is None:
            return ShardInfo(path, len(samples), Path(path).stat().st_size)
        _COUNTED[path] = len(samples)
        return ShardInfo(path, len(samples), len(blob))

    def build_stream(
        self, spec: Spec, shards: list[str], variant: StreamVariant
    ) -> IterableDataset:
        from raytune_loader.pipeline.device import collate_encoded

        _webdataset()  # installed, or the error says how
        shards = shards or self.shards(spec)
        reader = _TarShards(_store(spec))
        collate = collate_encoded if variant.decode == "device" else default_collate
        return ShardStream(
            shards, _counted(reader, shards), reader,
            _Decoded(variant.transfer, variant.decode), shuffle_buffer=variant.shuffle_buffer,
            seed=variant.seed, repeat=variant.repeat, batch_size=variant.batch_size,
            collate=collate,
        )  # fmt: skip

    def describe(self, spec: Spec) -> dict[str, Any]:
        found: dict[str, Any] = {"kind": "webdataset", "shards": len(self.shards(spec))}
        store = _store(spec)
        if store is not None:
            found["store"] = store.describe()
        return found


COUNT_THREADS = 16  # a store's shards counted at once (a whole shard's GET each)


def _counted(reader: _TarShards, shards: list[str]) -> list[int]:
    """Each shard's samples: read from disk one after another, fetched from a store
    :data:`COUNT_THREADS` at once (unless counted already, by this process or the one
    whose listing it took)."""
    if reader.store is None or len(shards) < 2:
        return [reader.count(path) for path in shards]
    with ThreadPoolExecutor(COUNT_THREADS, "raytune-count") as pool:
        return list(pool.map(reader.count, shards))


def _store(spec: Spec) -> Store | None:
    """The bucket the shards are in (a Store at its root), or None for local shards."""
    if not is_remote(spec.data_root):
        return None
    url = parse(str(spec.data_root).split("{", 1)[0])
    return Store(StoreUrl(url.scheme, url.bucket), StoreOptions.from_pairs(spec.storage_options))


def _remote_shards(root: str, options: StoreOptions) -> tuple[str, ...]:
    """The shard URLs ``root`` names: a brace pattern expanded (no request: a shard that
    is not there is named when it is counted), or the ``.tar`` objects under a prefix,
    listed once in this process."""
    if (root, options) in _LISTED:
        return _LISTED[(root, options)]
    if "{" in root:
        found = tuple(_webdataset().shardlists.expand_urls(root))
        buckets = {parse(url).bucket for url in found}
        if len(buckets) > 1:
            raise DatasetError(f"webdataset: {root} names shards in {len(buckets)} buckets; "
                               "keep them in one")  # fmt: skip
    else:
        url = parse(root)
        store = Store(url, options)
        store.check()
        found = tuple(url.of(key) for key, _ in store.list() if key.endswith(".tar"))
        if not found:
            raise DatasetError(
                f"webdataset: {root} holds no .tar object: put the shards there, or name "
                "them with a pattern like shards-{0000..0127}.tar"
            )
    _LISTED[(root, options)] = found
    return found


def _fetched(store: Store, url: str) -> bytes:
    """The shard at ``url``, one GET (retried and counted by the store); a DatasetError
    naming it where it is not there."""
    try:
        return store.get(parse(url).prefix)
    except CorruptSampleError:  # listed, or named by the pattern, but not there
        raise DatasetError(
            f"webdataset: shard {url} does not exist; check the pattern or the prefix"
        ) from None


def _tar(path: str, blob: bytes | None, stream: bool = False) -> tarfile.TarFile:
    """The shard as a tar file: from disk, or from the bytes fetched from a store."""
    mode = "r|*" if stream else "r:*"
    if blob is None:
        return tarfile.open(path, mode)
    return tarfile.open(fileobj=io.BytesIO(blob), mode=mode)


_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta


@dataclass(frozen=True)
class _TarShards:
    """Reads tar shards as webdataset groups them: the files of one key in a row are a
    sample (``{"__key__", "__url__", ext: bytes}``). Members are walked lazily, seeking
    past the data of the samples before a span; picklable, for spawned workers. With a
    ``store``, each shard is an object of its bucket, fetched whole."""

    store: Store | None = None

    def count(self, path: str) -> int:
        if self.store is None:
            return sum(1 for _ in _keyed(path, read=False))
        if path not in _COUNTED:  # counted by the driver, and handed on, or counted here
            blob = _fetched(self.store, path)
            _COUNTED[path] = sum(1 for _ in _keyed(path, read=False, blob=blob))
        return _COUNTED[path]

    def read(
        self, path: str, start: int, stop: int, blob: bytes | None = None
    ) -> Iterator[dict[str, Any]]:
        if blob is None and self.store is not None:
            blob = _fetched(self.store, path)
        yield from itertools.islice(_keyed(path, read=True, first=start, blob=blob), stop - start)

    def reads(self, wanted: Iterable[tuple[str, int, int]], ahead: int) -> Iterator[Any]:
        """The samples of ``wanted`` spans (shard, start, stop; a list, or a run without
        end) in order, ``ahead`` shards fetched at once from a store while the first of
        them is read."""
        if self.store is None or ahead <= 1:
            yield from (s for path, start, stop in wanted for s in self.read(path, start, stop))
            return
        store, pool = self.store, _pool(ahead)
        spans = iter(wanted)
        waiting: collections.deque[Any] = collections.deque()
        for span in itertools.islice(spans, ahead):
            waiting.append((span, pool.submit(_fetched, store, span[0])))
        while waiting:
            (path, start, stop), blob = waiting.popleft()
            fetched = blob.result()
            for span in itertools.islice(spans, 1):
                waiting.append((span, pool.submit(_fetched, store, span[0])))
            yield from self.read(path, start, stop, fetched)

    def ray_reader(self, paths: Sequence[str]) -> str | None:
        return "webdataset"  # ray.data.read_webdataset groups members by webdataset's rule


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}  # (pid, threads): this process's
_POOLS_LOCK = threading.Lock()


def _forked() -> None:
    """A forked child: the parent's fetch threads did not come with it, nor may its lock."""
    global _POOLS_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def _pool(threads: int) -> ThreadPoolExecutor:
    """This process's pool of ``threads`` fetch threads (a forked worker makes its own)."""
    with _POOLS_LOCK:
        key = (os.getpid(), threads)
        if key not in _POOLS:
            _POOLS[key] = ThreadPoolExecutor(threads, "raytune-shards")
        return _POOLS[key]


def _keyed(
    path: str, *, read: bool, first: int = 0, blob: bytes | None = None
) -> Iterator[dict[str, Any]]:
    """The shard's samples from the ``first``-th on (their data read with ``read``), from
    disk or from its bytes ``blob`` fetched from a store."""
    from webdataset.tariterators import base_plus_ext

    index, key, members = -1, None, []
    try:
        with _tar(path, blob) as tar:
            for member in tar:
                if not member.isfile() or _META.match(member.name):
                    continue
                prefix, ext = base_plus_ext(member.name)
                if prefix is None:
                    continue
                if prefix != key:
                    if members:
                        yield _sample(tar, path, key, members, read)
                    index, key, members = index + 1, prefix, []
                if index >= first:
                    members.append((ext.lower(), member))
            if members:
                yield _sample(tar, path, key, members, read)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DatasetError(
            f"webdataset: shard {path} is truncated or not a tar file ({last_line(exc)}); "
            "rewrite it or leave it out"
        ) from None


def _sample(
    tar: tarfile.TarFile, path: str, key: Any, members: list[Any], read: bool
) -> dict[str, Any]:
    sample: dict[str, Any] = {"__key__": key, "__url__": path}
    for ext, member in members:
        sample[ext] = tar.extractfile(member).read() if read else b""  # type: ignore[union-attr]
    return sample


def _split(name: str) -> tuple[str, str, str]:
    """webdataset's key and extension: ``dir/n0001.jpg`` -> (``dir/n0001``, ``jpg``)."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), _, ext.lower()


def _first_image(path: str, store: Store | None) -> bytes:
    blob = _fetched(store, path) if store is not None else None
    with _tar(path, blob, stream=True) as tar:
        for entry in tar:
            if entry.isfile() and _split(entry.name)[2] in IMAGE_KEYS:
                return tar.extractfile(entry).read(3)  # type: ignore[union-attr]
    return b""


@dataclass(frozen=True)
class _Decoded:
    """A webdataset sample (a dict of bytes) as ``(image, class)`` with the variant's
    worker side; a picklable callable, for worker processes started by spawn."""

    transfer: str
    decode: str

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, int]:
        sample = {name.lower(): value for name, value in sample.items()}  # Ray keeps the case
        key = next((k for k in IMAGE_KEYS if k in sample), None)
        where = f"{sample.get('__url__', '?')}: sample {sample.get('__key__', '?')}"
        if key is None or LABEL_KEY not in sample:
            raise CorruptSampleError(f"{where} lacks an image or a {LABEL_KEY}")
        label = int(bytes(sample[LABEL_KEY]).decode().strip())
        try:
            return worker_image(sample[key], self.transfer, self.decode), label
        except CorruptSampleError as exc:
            raise CorruptSampleError(f"corrupt sample {where}: {exc}") from None


SOURCE = WebDatasetShards()
