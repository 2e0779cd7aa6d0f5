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
``.tar`` objects are the shards) are read where they live: each span one ranged GET of
its own samples' bytes through :class:`~raytune_loader.stores.store.Store` (retried
and counted as every request is), from the shard's index (:class:`TarIndex`: where its
samples start, learned when the driver counted it), and ``fetch_threads`` spans fetched
ahead in each worker while the current one is decoded (the read-ahead that hides a
store's latency); a check of a shard's first samples reads its first bytes alone.
A brace pattern is expanded without a request; a prefix is listed once per process.
"""

from __future__ import annotations

import contextlib
import glob
import io
import itertools
import os
import re
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from torch.utils.data import Dataset, IterableDataset, default_collate

from raytune_loader.errors import CorruptSampleError, DatasetError, last_line
from raytune_loader.loaders.shard_stream import ShardStream, StreamVariant
from raytune_loader.pipeline.transforms import worker_image
from raytune_loader.sources import store_shards
from raytune_loader.sources.base import ShardInfo, Source, Spec
from raytune_loader.sources.store_shards import COUNTED, ShardListing
from raytune_loader.stores.store import Store
from raytune_loader.stores.url import is_remote

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
INDEX_POINTS = 64  # the most samples of a shard whose first byte its index keeps
LABEL_KEY = "cls"
INSTALL = "pip install webdataset"
WHAT = "webdataset"  # the format, as messages name it
EXAMPLE = "shards-{0000..0127}.tar"

__all__ = ["SOURCE", "ShardListing", "WebDatasetShards"]


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
        # the trial's shards through ray.data.read_webdataset (ShardStream.ray_read); in a
        # bucket, through Arrow's S3 filesystem (stores.arrow)
        return True

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
            return list(_remote_shards(spec))
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
        return store_shards.listing_for(spec, _remote_shards(spec))

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
        blob = store_shards.fetched(store, path, WHAT) if store is not None else None
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
        _index_of(path, blob)
        return ShardInfo(path, len(samples), len(blob))

    def build_stream(
        self, spec: Spec, shards: list[str], variant: StreamVariant
    ) -> IterableDataset:
        from raytune_loader.pipeline.device import collate_encoded

        _webdataset()  # installed, or the error says how
        shards = shards or self.shards(spec)
        reader = _TarShards(_store(spec))
        sizes = store_shards.counted(reader.count, shards, reader.store is not None)
        if reader.store is not None:  # counted: each shard's index is known
            reader = _TarShards(reader.store, {path: reader.indexed(path) for path in shards})
        collate = collate_encoded if variant.decode == "device" else default_collate
        return ShardStream(
            shards, sizes, reader,
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


def _store(spec: Spec) -> Store | None:
    return store_shards.bucket_for(spec)


def _remote_shards(spec: Spec) -> tuple[str, ...]:
    return store_shards.named_for(spec, ".tar", WHAT, EXAMPLE)


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
    ``store``, each shard is an object of its bucket: a span reads its own samples'
    bytes (:meth:`fetch`), a check the shard's first bytes (:meth:`read_head`)."""

    store: Store | None = None
    # the indexes the stream's maker had, for loader workers that do not inherit this
    # process's (started by spawn or forkserver)
    known: dict[str, TarIndex] = field(default_factory=dict, compare=False)

    def count(self, path: str) -> int:
        if self.store is None:
            return sum(1 for _ in _keyed(path, read=False))
        return self.indexed(path).samples

    def indexed(self, path: str) -> TarIndex:
        """The index of a shard in the store: made by the driver and handed on, or here
        (a whole GET)."""
        found = self._known(path)
        if found is None:
            assert self.store is not None
            found = _index_of(path, store_shards.fetched(self.store, path, WHAT))
        return found

    def _known(self, path: str) -> TarIndex | None:
        return COUNTED.get(path) or self.known.get(path)

    def fetch(self, path: str, start: int, stop: int) -> tuple[bytes, int]:
        """The bytes of samples ``start`` to ``stop`` of a shard in the store and the
        sample they begin with: one ranged GET from the shard's index (the whole shard,
        one plain GET, where the span covers it, the shard is compressed, the store
        ignores the range, or no index reached this process: it is made of that GET)."""
        assert self.store is not None
        index = self._known(path)
        if index is None:
            blob = store_shards.fetched(self.store, path, WHAT)
            _index_of(path, blob)  # for this process's next spans of it
            return blob, 0
        begin, length, first = index.span(start, stop)
        if (begin, length) == (0, index.size):
            return store_shards.fetched(self.store, path, WHAT), 0
        blob = store_shards.ranged(self.store, path, WHAT, begin, length, index.size)
        return blob, (first if len(blob) == length else 0)  # or the store ignored Range

    def read(
        self, path: str, start: int, stop: int, fetched: tuple[bytes, int] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Samples ``start`` to ``stop`` (excluded) of the shard at ``path``: from disk,
        or from the bytes :meth:`fetch` got of it (fetched here where none are given)."""
        if fetched is None and self.store is not None:
            fetched = self.fetch(path, start, stop)
        blob, first = fetched if fetched is not None else (None, 0)
        samples = _keyed(path, read=True, first=start - first, blob=blob)
        yield from itertools.islice(samples, stop - start)

    def read_head(self, path: str, need: int = 1) -> Iterator[dict[str, Any]]:
        """The shard's samples from its first on, as far as they are read: from a store,
        ranged GETs sized for the first ``need`` (:func:`~store_shards.read_head`), for a
        check of them."""
        if self.store is None:
            yield from _keyed(path, read=True)
            return
        complete = partial(_complete, path)
        yield from store_shards.read_head(self.store, path, WHAT, complete, need)

    def reads(self, wanted: Iterable[tuple[str, int, int]], ahead: int) -> Iterator[Any]:
        """The samples of ``wanted`` spans (shard, start, stop; a list, or a run without
        end) in order, ``ahead`` spans fetched at once from a store while the first of
        them is read."""
        if self.store is None or ahead <= 1:
            yield from (s for path, start, stop in wanted for s in self.read(path, start, stop))
            return
        yield from store_shards.read_ahead(self, wanted, ahead)

    def ray_reader(self, paths: Sequence[str]) -> str | None:
        return "webdataset"  # ray.data.read_webdataset groups members by webdataset's rule


def _keyed(
    path: str, *, read: bool, first: int = 0, blob: bytes | None = None
) -> Iterator[dict[str, Any]]:
    """The shard's samples from the ``first``-th on (their data read with ``read``), from
    disk or from its bytes ``blob`` fetched from a store."""
    with _guarded(path), _tar(path, blob) as tar:
        for key, members in itertools.islice(_groups(tar), first, None):
            yield _sample(tar, path, key, members, read)


def _groups(tar: tarfile.TarFile) -> Iterator[tuple[Any, list[tuple[str, tarfile.TarInfo]]]]:
    """The shard's samples as webdataset groups them: (key, its members by extension)."""
    from webdataset.tariterators import base_plus_ext

    key, members = None, []
    for member in tar:
        if not member.isfile() or _META.match(member.name):
            continue
        prefix, ext = base_plus_ext(member.name)
        if prefix is None:
            continue
        if prefix != key:
            if members:
                yield key, members
            key, members = prefix, []
        members.append((ext.lower(), member))
    if members:
        yield key, members


@contextlib.contextmanager
def _guarded(path: str) -> Iterator[None]:
    """A shard tarfile cannot read, as the one-line DatasetError naming it."""
    try:
        yield
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DatasetError(
            f"webdataset: shard {path} is truncated or not a tar file ({last_line(exc)}); "
            "rewrite it or leave it out"
        ) from None


class TarIndex(NamedTuple):
    """What reading a tar shard in a store once taught: its samples, its bytes, and the
    first byte of every ``stride``-th sample (its first member's header), so that a span
    of it is one ranged GET of its own samples' bytes; no offsets for a compressed
    shard, whose every span is the whole shard."""

    samples: int
    size: int
    stride: int
    offsets: tuple[int, ...]

    def span(self, start: int, stop: int) -> tuple[int, int, int]:
        """(first byte, bytes, first sample) of the range that holds samples ``start``
        to ``stop`` (excluded): from the indexed sample at or before ``start`` to the
        one at or after ``stop`` (at most ``stride - 1`` samples more at each end)."""
        if not self.offsets:
            return 0, self.size, 0
        low, high = start // self.stride, -(-stop // self.stride)
        end = self.offsets[high] if high < len(self.offsets) else self.size
        return self.offsets[low], end - self.offsets[low], low * self.stride


def _index_of(path: str, blob: bytes) -> TarIndex:
    """The index of a shard fetched whole, kept as this process's (``COUNTED``): its
    samples counted and, in a plain (ustar) tar, where every ``stride``-th of them
    starts, at most :data:`INDEX_POINTS` of them (the first at byte 0: what comes before
    its first member, a folder's entry or a global PAX header, is read with it)."""
    with _guarded(path), _tar(path, blob) as tar:
        starts = [members[0][1].offset for _, members in _groups(tar)]
    stride = max(1, -(-len(starts) // INDEX_POINTS))
    plain = blob[257:262] == b"ustar"  # compressed, the offsets are not the object's
    offsets = (0, *starts[stride::stride]) if plain and starts else ()
    COUNTED[path] = found = TarIndex(len(starts), len(blob), stride, offsets)
    return found


def _complete(path: str, blob: bytes, whole: bool) -> list[dict[str, Any]]:
    """The samples complete in ``blob``, the shard's first bytes (all of it where
    ``whole``). A sample comes out once the next one's first header was read, or the
    tar ended. A blob cut in a member's data fails the next header's read (tarfile
    checks that the data before it is there), and the samples out by then are whole;
    one cut in a header ends as if the shard did, and its last sample may lack a
    member."""
    if whole:
        return list(_keyed(path, read=True, blob=blob))
    found: list[dict[str, Any]] = []
    try:
        for sample in _keyed(path, read=True, blob=blob):
            found.append(sample)
    except DatasetError:
        return found
    return found[:-1]


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
    """The first bytes of the shard's first sample's image (b"" if it has none, and the
    device decoder is then not offered: a sample without an image fails the shard's
    check anyway): from a store, from ranged GETs of the shard's first bytes, not the
    whole shard (hundreds of MB in a real dataset)."""
    heads = _TarShards(store).read_head(path)
    try:
        sample = next(heads, {})
    finally:
        heads.close()
    return next((bytes(sample[key][:3]) for key in IMAGE_KEYS if key in sample), b"")


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
