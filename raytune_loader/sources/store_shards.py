"""Shards that are objects of a store: named once, counted once, fetched by span, read ahead.

What the shard formats (:mod:`~raytune_loader.sources.webdataset_shards`' tar files,
:mod:`~raytune_loader.sources.hf_tables`' Parquet files) share when their files live in
a bucket. A brace pattern (``s3://bucket/shards-{0000..0127}.tar``) is expanded without
a request; a prefix is listed once in a process, for the objects of one suffix. Each
span a worker reads is one GET through :class:`~raytune_loader.stores.store.Store`
(retried and counted there), of the bytes its format says the span needs (a tar
shard's span, its own samples'; a Parquet file's, its row groups', with a second GET
of the footer beside it where they do not reach it), or of the whole object where the
format cannot tell; a check of its first samples reads its first bytes alone
(:func:`read_head`). What reading a shard taught
(its samples, a tar shard's index) is kept, so that the driver counts a shard once and
hands its counts to the trials' processes (:class:`ShardListing`). A worker's reads
keep ``ahead`` spans in flight while the current one is decoded (:func:`read_ahead`):
the read-ahead that hides a store's latency.
"""

from __future__ import annotations

import collections
import io
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from raytune_loader.errors import CorruptSampleError, DatasetError
from raytune_loader.stores.pools import FetchPools
from raytune_loader.stores.store import Store, StoreOptions
from raytune_loader.stores.url import StoreUrl, is_remote, parse

if TYPE_CHECKING:
    from raytune_loader.sources.base import Spec

COUNT_THREADS = 16  # a store's shards counted at once (a whole shard's GET each)
HEAD_BYTES = 256 * 1024  # read_head's first ranged GET: two ImageNet JPEGs of 110 KB
LISTED: dict[tuple[str, StoreOptions], tuple[str, ...]] = {}  # this process's listings
COUNTED: dict[str, Any] = {}  # a shard's URL -> what reading it once taught (its samples)


@dataclass(frozen=True)
class ShardListing:
    """What the search's driver learned of shards in a store (their URLs, what it counted
    of them), handed to the trials' processes in the job so that they list and count
    nothing again (a count is a whole shard's GET)."""

    root: str
    options: StoreOptions
    shards: tuple[str, ...]
    counted: tuple[tuple[str, Any], ...]

    def adopt(self) -> None:
        """Take it as this process's own."""
        LISTED[(self.root, self.options)] = self.shards
        COUNTED.update(self.counted)


def listing_for(spec: Spec, shards: Sequence[str]) -> ShardListing:
    """What this process listed of ``spec``'s data root and counted of its ``shards``,
    to hand on."""
    counted = tuple((url, COUNTED[url]) for url in shards if url in COUNTED)
    return ShardListing(str(spec.data_root), _options(spec), tuple(shards), counted)


def bucket_for(spec: Spec) -> Store | None:
    """The bucket ``spec``'s shards are in, or None for shards on disk."""
    return bucket_of(spec.data_root, _options(spec))


def named_for(spec: Spec, suffix: str, what: str, example: str) -> tuple[str, ...]:
    """The shard URLs ``spec``'s data root names (:func:`named_shards`)."""
    return named_shards(str(spec.data_root), _options(spec), suffix, what, example)


def _options(spec: Spec) -> StoreOptions:
    return StoreOptions.from_pairs(spec.storage_options)


def bucket_of(root: object, options: StoreOptions) -> Store | None:
    """The bucket a remote ``root`` (a prefix or a brace pattern) is in, as a Store at its
    root; None for a local path."""
    if not is_remote(root):
        return None
    url = parse(str(root).split("{", 1)[0])
    return Store(StoreUrl(url.scheme, url.bucket), options)


def named_shards(
    root: str, options: StoreOptions, suffix: str, what: str, example: str
) -> tuple[str, ...]:
    """The shard URLs ``root`` names: a brace pattern expanded (no request: a shard that
    is not there is named when it is fetched), or the ``suffix`` objects under a prefix,
    listed once in this process. ``what`` names the format in messages; ``example`` is a
    pattern of it."""
    if (root, options) in LISTED:
        return LISTED[(root, options)]
    if "{" in root:
        found = tuple(expand_braces(root))
        buckets = {parse(url).bucket for url in found}
        if len(buckets) > 1:
            raise DatasetError(f"{what}: {root} names shards in {len(buckets)} buckets; "
                               "keep them in one")  # fmt: skip
    else:
        url = parse(root)
        store = Store(url, options)
        store.check()
        found = tuple(url.of(key) for key, _, _ in store.list() if key.endswith(suffix))
        if not found:
            raise DatasetError(
                f"{what}: {root} holds no {suffix} object: put the files there, or name "
                f"them with a pattern like {example}"
            )
    LISTED[(root, options)] = found
    return found


def expand_braces(pattern: str) -> list[str]:
    """A shell-style brace pattern's names, as webdataset expands them (``braceexpand``:
    ``{0000..0003}`` a zero-padded range, ``{a,b}`` each choice, nested, left to right)."""
    try:
        from braceexpand import braceexpand
    except ImportError:
        raise DatasetError(
            f"{pattern} is a brace pattern, which needs the braceexpand package: "
            "pip install -e '.[streams]'"
        ) from None
    return list(braceexpand(pattern))


def fetched(store: Store, url: str, what: str, length: int | None = None, start: int = 0) -> bytes:
    """The shard at ``url``, one GET (retried and counted by the store, and kept inside
    :func:`~raytune_loader.stores.kept.kept`), or ``length`` bytes of it alone from its
    ``start``-th byte on; a DatasetError naming it where it is not there."""
    try:
        return store.get(parse(url).prefix, length, start)
    except CorruptSampleError:  # listed, or named by the pattern, but not there
        raise DatasetError(
            f"{what}: shard {url} does not exist; check the pattern or the prefix"
        ) from None


def ranged(store: Store, url: str, what: str, start: int, length: int, size: int) -> bytes:
    """``length`` bytes of the shard at ``url`` from its ``start``-th on, one ranged GET
    (:func:`fetched`), or the whole shard of ``size`` bytes, as it was counted, from a
    store that ignores Range; a one-line DatasetError where it answers neither: the
    object was written again since it was counted."""
    blob = fetched(store, url, what, length, start)
    if len(blob) not in (length, size):
        raise DatasetError(
            f"{what}: shard {url} changed since the search counted it (a range of {length} "
            f"bytes answered {len(blob)}); run the search again on the data as it is now"
        )
    return blob


def read_head(
    store: Store,
    url: str,
    what: str,
    complete: Callable[[bytes, bool], list[Any]],
    need: int = 1,
) -> Iterator[Any]:
    """The shard's samples in order, from ranged GETs of its first bytes, as far as they
    are read: a check of a stream's first ``need`` samples (one, or a batch made in the
    workers) without the whole shard's GET (a 5 MB shard 100 Mbit/s away: 0.4 s, before
    each first measurement of a variant). The first range is :data:`HEAD_BYTES`; each
    next one four times the last, or what ``need`` samples and one more take at the
    bytes a whole sample took so far, if that is more. ``complete(blob, whole)`` gives
    the samples complete in ``blob``, the shard's first bytes (all of it where
    ``whole``: the store answered fewer bytes than asked, or more, ignoring the range)."""
    done, size = 0, HEAD_BYTES
    while True:
        blob = fetched(store, url, what, size)
        whole = len(blob) != size
        found = complete(blob, whole)
        yield from found[done:]
        done = max(done, len(found))
        if whole:
            return
        per_sample = size / max(1, len(found))
        size = max(4 * size, int(per_sample * (need + 1) * 1.25))


class SeekableFile(io.RawIOBase):
    """A read-only file of ``size`` bytes whose reads a subclass's ``readinto`` makes
    from the position on: what pyarrow reads a Parquet file from."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size, self.position = size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position


class RangedShard(SeekableFile):
    """The shard at ``url`` (``size`` bytes) as a seekable file whose every read is a
    ranged GET of the bytes it asks for: what pyarrow reads a Parquet file's footer and
    the row groups it wants from, rather than the whole shard. From a store that
    ignores Range, the whole shard its first GET answered is kept and read from."""

    def __init__(self, store: Store, url: str, what: str, size: int) -> None:
        super().__init__(size)
        self.store, self.url, self.what = store, url, what
        self.whole: bytes | None = None

    def readinto(self, buffer: Any) -> int:
        """Fills ``buffer`` from the position on, by one ranged GET; the bytes read."""
        want = min(len(buffer), self.size - self.position)
        if want <= 0:
            return 0
        if self.whole is not None:
            data = self.whole[self.position : self.position + want]
        else:
            data = fetched(self.store, self.url, self.what, want, self.position)
        if len(data) > want:  # a store that ignores the range answers the whole shard
            self.whole, data = data, data[self.position : self.position + want]
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def counted(count: Callable[[str], Any], shards: Sequence[str], remote: bool) -> list[Any]:
    """``count`` of each shard: one after another from disk, :data:`COUNT_THREADS` at once
    from a store (each a whole shard's GET, unless counted already)."""
    if not remote or len(shards) < 2:
        return [count(path) for path in shards]
    with ThreadPoolExecutor(COUNT_THREADS, "raytune-count") as pool:
        return list(pool.map(count, shards))


class SpanReader(Protocol):
    """What :func:`read_ahead` reads with: a span's bytes fetched (``fetch``, on a pool
    thread), then its samples read from them (``read``)."""

    def fetch(self, path: str, start: int, stop: int) -> Any:
        """The bytes samples ``start`` to ``stop`` of the shard at ``path`` are read from."""

    def read(self, path: str, start: int, stop: int, fetched: Any) -> Iterator[Any]:
        """Samples ``start`` to ``stop`` of the shard, from what ``fetch`` got."""


def read_ahead(
    reader: SpanReader, wanted: Iterable[tuple[str, int, int]], ahead: int
) -> Iterator[Any]:
    """The samples of the ``wanted`` spans (shard, start, stop; a list, or a run without
    end) in order, read by ``reader``, ``ahead`` spans fetched at once while the first
    of them is read."""
    pool = _POOLS.get(ahead)  # the calling worker's own, a thread worker's too
    spans = iter(wanted)
    waiting: collections.deque[Any] = collections.deque()
    for span in itertools.islice(spans, ahead):
        waiting.append((span, pool.submit(reader.fetch, *span)))
    while waiting:
        (path, start, stop), got = waiting.popleft()
        fetched = got.result()
        for span in itertools.islice(spans, 1):
            waiting.append((span, pool.submit(reader.fetch, *span)))
        yield from reader.read(path, start, stop, fetched)


_POOLS = FetchPools("raytune-shards")  # each reading thread's: ``ahead`` per worker
