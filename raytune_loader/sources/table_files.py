"""The files of a Hugging Face table as pyarrow reads them: Arrow (``save_to_disk``) and
Parquet files, on disk or fetched from a store.

:class:`TableShards` reads a file's rows a record batch at a time (a Parquet file's row
groups before a span skipped); :class:`RemoteFiles` reads Parquet files that are
objects of a store, ``ahead`` spans in flight: a span fetches the row groups that
hold its rows and the footer, ranged GETs (a check of a file's first rows reads its
footer and first row groups alone), and learns each file once (rows, the largest
label, a ``ClassLabel``'s names from its schema, where its row groups start, how
long its footer is), what the driver hands to the trials. No Hugging Face import
here: the ``datasets`` package is :mod:`~raytune_loader.sources.hf_tables`' business.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from raytune_loader.errors import DatasetError, last_line
from raytune_loader.sources import store_shards
from raytune_loader.sources.store_shards import COUNTED
from raytune_loader.stores.store import Store

if TYPE_CHECKING:
    from raytune_loader.sources.base import Spec

WHAT = "hf"  # the format, as messages name it
FOOTER_READ = 64 * 1024  # a Parquet file's last bytes Arrow reads first, for its footer


def opened(path: str, blob: bytes | Pieces | None) -> Any:
    """What pyarrow reads: the file at ``path``, or its bytes fetched from a store (all
    of them, or the :class:`Pieces` a span fetched)."""
    import pyarrow as pa

    if isinstance(blob, Pieces):
        return blob.file()
    return path if blob is None else pa.BufferReader(blob)


@dataclass(frozen=True)
class Pieces:
    """Parts of a Parquet file of ``size`` bytes, each ``(first byte, bytes)``: what a
    span fetched of it (the row groups that hold its rows, and the footer's read, in one
    part where they meet)."""

    size: int
    parts: tuple[tuple[int, bytes], ...]

    def file(self) -> io.RawIOBase:
        """The whole file, as pyarrow reads it: a read of a byte in no part is an OSError."""
        return _PiecesFile(self)


class _PiecesFile(store_shards.SeekableFile):
    def __init__(self, pieces: Pieces) -> None:
        super().__init__(pieces.size)
        self.pieces = pieces

    def readinto(self, buffer: Any) -> int:
        """Fills ``buffer`` from the part that holds the position on; the bytes read."""
        if self.position >= self.size:
            return 0
        for start, data in self.pieces.parts:
            if start <= self.position < start + len(data):
                got = data[self.position - start : self.position - start + len(buffer)]
                buffer[: len(got)] = got
                self.position += len(got)
                return len(got)
        fetched = ", ".join(f"{a}-{a + len(d)}" for a, d in self.pieces.parts)
        raise OSError(f"byte {self.position} of {self.size} was not fetched (bytes {fetched})")


def read_errors() -> tuple[type[BaseException], ...]:
    """What pyarrow raises for a file it cannot read (ArrowInvalid is a ValueError)."""
    import pyarrow

    return (OSError, ValueError, pyarrow.ArrowException)


def unreadable(path: str, exc: BaseException) -> DatasetError:
    """The one-line error for a file pyarrow could not read, naming it."""
    kind = "a Parquet" if path.endswith(".parquet") else "an Arrow"
    return DatasetError(
        f"hf: {path} is truncated or not {kind} file ({last_line(exc)}); rewrite it or leave it out"
    )


def batches(
    path: str,
    columns: list[str],
    first_row: int = 0,
    blob: bytes | Pieces | None = None,
    stop: int | None = None,
) -> Iterator[Any]:
    """``columns`` of one shard, a record batch at a time (pyarrow), of the Parquet row
    groups that hold rows ``first_row`` to ``stop`` (excluded; None: the last), and no
    other (every batch of an Arrow file: they are mapped, not read, until used)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.endswith(".parquet"):
        with pq.ParquetFile(opened(path, blob)) as table:
            meta, groups, seen = table.metadata, [], 0
            for group in range(meta.num_row_groups):
                if stop is not None and seen >= stop:
                    break
                seen += meta.row_group(group).num_rows
                if seen > first_row:
                    groups.append(group)
            if groups:
                yield from table.iter_batches(columns=columns, row_groups=groups)
        return
    with pa.memory_map(path) as mapped:
        for batch in pa.ipc.open_stream(mapped):
            yield batch.select(columns)


def row_count(path: str) -> int:
    """A local file's rows (a Parquet file's from its footer)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.endswith(".parquet"):
        return int(pq.read_metadata(path).num_rows)
    with pa.memory_map(path) as mapped:
        return sum(len(batch) for batch in pa.ipc.open_stream(mapped))


def check_file(spec: Columns | Spec, path: str, blob: bytes | None = None) -> Any:
    """The file's schema (a Parquet file's footer), which has the image and label columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.endswith(".parquet"):
            schema = pq.read_schema(opened(path, blob))
        else:
            with pa.memory_map(path) as mapped:
                schema = pa.ipc.open_stream(mapped).schema
    except read_errors() as exc:
        raise unreadable(path, exc) from None
    check_columns(spec, path, schema)
    return schema


def check_columns(spec: Columns | Spec, where: str, schema: Any) -> None:
    """That ``schema`` has the image and label columns, of types they can hold; a
    DatasetError naming the option that names the column otherwise."""
    import pyarrow as pa

    def image(kind: Any) -> bool:
        if pa.types.is_struct(kind):
            return {"bytes", "path"} & {kind.field(i).name for i in range(kind.num_fields)} != set()
        return any(is_(kind) for is_ in (pa.types.is_binary, pa.types.is_large_binary,
                                         pa.types.is_string, pa.types.is_large_string))  # fmt: skip

    for column, role, fits, holds in (
        (spec.image_column, "image", image, "an image (bytes or a path)"),
        (spec.label_column, "label", pa.types.is_integer, "class indices (integers)"),
    ):
        if column not in schema.names:
            raise DatasetError(
                f"hf: {where} has no column {column!r} (it has {', '.join(schema.names)}); "
                f"name the {role} column with --{role}-column"
            )
        if not fits(schema.field(column).type):
            raise DatasetError(
                f"hf: column {column!r} of {where} holds {schema.field(column).type}, not "
                f"{holds}; name the {role} column with --{role}-column"
            )


@dataclass(frozen=True)
class TableShards:
    """Reads rows of Arrow (``save_to_disk``) and Parquet files as dicts of ``columns``,
    plus the file and row (``__url__``, ``__row__``); picklable, for spawned workers."""

    columns: tuple[str, ...]

    def count(self, path: str) -> int:
        """The file's rows."""
        return row_count(path)

    def ray_reader(self, paths: Sequence[str]) -> str | None:
        """``read_parquet`` for Parquet files; Ray has no reader of HF's Arrow files."""
        return "parquet" if all(p.endswith(".parquet") for p in paths) else None

    def read(
        self, path: str, start: int, stop: int, blob: bytes | Pieces | None = None
    ) -> Iterator[dict[str, Any]]:
        """Rows ``start`` to ``stop`` (excluded) of the file at ``path`` (or of its bytes,
        ``blob``, fetched from a store)."""
        offset = skipped(path, start, blob)
        for batch in batches(path, list(self.columns), start, blob, stop):
            low, high = max(start, offset), min(stop, offset + len(batch))
            if low < high:
                rows = batch.slice(low - offset, high - low).to_pylist()
                for row_number, row in enumerate(rows, low):
                    yield {**row, "__url__": path, "__row__": row_number}
            offset += len(batch)
            if offset >= stop:
                return


def skipped(path: str, start: int, blob: bytes | Pieces | None = None) -> int:
    """Rows of the Parquet row groups wholly before row ``start`` (they are not read)."""
    if not path.endswith(".parquet"):
        return 0
    import pyarrow.parquet as pq

    meta, skipped = pq.read_metadata(opened(path, blob)), 0
    for group in range(meta.num_row_groups):
        rows = meta.row_group(group).num_rows
        if skipped + rows > start:
            break
        skipped += rows
    return skipped


class Facts(NamedTuple):
    """What reading a file in a store once taught: its rows, bytes, largest label, its
    ClassLabel's names (None where the schema has none), each row group's rows and
    first byte, and its footer's length (what a span's ranged GETs are cut from)."""

    rows: int
    bytes: int
    top_label: int
    names: tuple[str, ...] | None
    groups: tuple[tuple[int, int], ...] = ()
    footer: int = 0

    def footer_read(self) -> int:
        """The first byte of Arrow's first read of the file, its footer's: the file's last
        :data:`FOOTER_READ` bytes, or the whole footer where it is longer."""
        return max(0, self.bytes - max(FOOTER_READ, self.footer))

    def span_bytes(self, start: int, stop: int) -> tuple[int, int]:
        """The bytes, ``(first, end)``, that hold rows ``start`` to ``stop`` (excluded):
        from the first byte of their row groups (0 where those begin with the file's
        first) to the end of the last (the next group's first byte in the file, a writer
        may place groups out of order), or to the file's end, with Arrow's read of the
        footer, where that is no farther; the whole file where the groups are unknown."""
        starts, held, seen = sorted(first for _, first in self.groups), [], 0
        for rows, first in self.groups:
            if seen < stop and seen + rows > start:
                held.append(first)
            seen += rows
        if not held:
            return 0, self.bytes
        begin = 0 if min(held) == starts[0] else min(held)
        end = max(next((s for s in starts if s > first), self.bytes) for first in held)
        if end >= self.footer_read() or not self.footer:  # (a footer not noted: to the end)
            return min(begin, self.footer_read()), self.bytes
        return begin, end


def footer_length(blob: bytes) -> int:
    """The length of the Parquet file ``blob``'s footer: its metadata, their length and
    the closing magic."""
    return int.from_bytes(blob[-8:-4], "little") + 8 if len(blob) >= 8 else len(blob)


def row_groups(blob: bytes) -> tuple[tuple[int, int], ...]:
    """Each row group's rows and first byte (its first column chunk's first page, the
    lesser of a chunk's dictionary and data pages' offsets, as Arrow reads a chunk from,
    a dictionary offset of 0 being unset) in the Parquet file ``blob``."""
    import pyarrow.parquet as pq

    meta, found = pq.read_metadata(opened("", blob)), []
    for group in range(meta.num_row_groups):
        chunks = [meta.row_group(group).column(c) for c in range(meta.num_columns)]
        first = min(min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset)
                    if c.has_dictionary_page else c.data_page_offset for c in chunks)  # fmt: skip
        found.append((meta.row_group(group).num_rows, int(first)))
    return tuple(found)


@dataclass(frozen=True)
class RemoteFiles(TableShards):
    """Parquet files in a store: a span one GET or two (:meth:`fetch`), ``ahead`` spans
    in flight (:func:`~raytune_loader.sources.store_shards.read_ahead`)."""

    store: Store | None = None
    # the facts the stream's maker had, for loader workers that do not inherit this
    # process's (started by spawn or forkserver)
    known: dict[str, Facts] = field(default_factory=dict, compare=False)

    def learned(self, url: str) -> Facts:
        """The file's facts: read once in this process (a GET, its footer checked and its
        labels read through), or handed on by the driver's listing."""
        if url not in COUNTED and url in self.known:
            return self.known[url]
        if url not in COUNTED:
            import pyarrow.compute as pc

            assert self.store is not None
            blob = store_shards.fetched(self.store, url, WHAT)
            image, label = self.columns
            schema = check_file(Columns(image, label), url, blob)
            try:
                labels = [b.column(0) for b in batches(url, [label], blob=blob)]
            except read_errors() as exc:
                raise unreadable(url, exc) from None
            top = max((pc.max(values).as_py() or 0 for values in labels), default=0)
            names = label_names(schema, label)
            rows, groups = sum(len(v) for v in labels), row_groups(blob)
            COUNTED[url] = Facts(rows, len(blob), top, names, groups, footer_length(blob))
        return COUNTED[url]  # type: ignore[no-any-return]

    def count(self, path: str) -> int:
        return self.learned(path).rows

    def ray_reader(self, paths: Sequence[str]) -> str | None:
        """``read_parquet`` of the bucket's Parquet files (through Arrow's S3 filesystem)."""
        return "parquet" if all(p.endswith(".parquet") for p in paths) else None

    def reads(self, wanted: Any, ahead: int) -> Iterator[dict[str, Any]]:
        """The rows of ``wanted`` spans in order, ``ahead`` spans fetched at once."""
        yield from store_shards.read_ahead(self, wanted, max(1, ahead))

    def fetch(self, path: str, start: int, stop: int) -> bytes | Pieces:
        """What a span of a file is read from: the :class:`Pieces` of the row groups that
        hold its rows and of the footer, two ranged GETs at once (one, to the end, where
        they meet); the whole file, one GET, where the span needs it all, where no facts
        reached this process, or where the store ignores Range."""
        assert self.store is not None
        facts = COUNTED.get(path) or self.known.get(path)
        if facts is None:  # no facts reached this process: the file is read whole
            return store_shards.fetched(self.store, path, WHAT)
        begin, end = facts.span_bytes(start, stop)
        if (begin, end) == (0, facts.bytes):
            return store_shards.fetched(self.store, path, WHAT)
        if end == facts.bytes:
            parts = [self._part(path, facts, begin, end)]
        else:  # the footer's GET beside the row groups': no latency added
            pool = ThreadPoolExecutor(1)
            try:
                footer = pool.submit(self._part, path, facts, facts.footer_read(), facts.bytes)
                parts = [self._part(path, facts, begin, end), footer.result()]
            finally:  # a failed GET does not wait for the other's retries
                pool.shutdown(wait=False, cancel_futures=True)
        whole = next((data for _, data in parts if len(data) == facts.bytes), None)
        return whole if whole is not None else Pieces(facts.bytes, tuple(parts))

    def _part(self, path: str, facts: Facts, begin: int, end: int) -> tuple[int, bytes]:
        """Bytes ``begin`` to ``end`` of the file and where they start (:func:`ranged`)."""
        assert self.store is not None
        return begin, store_shards.ranged(self.store, path, WHAT, begin, end - begin, facts.bytes)

    def read_head(self, path: str, need: int = 1) -> Iterator[dict[str, Any]]:
        """The file's rows from its first on, as far as they are read, for a check of
        its first ``need`` (any number: a row group at a time): ranged GETs of its
        footer, then of each row group read, not the whole file (the Hub's Parquet
        files of images hold row groups of 100 rows in files of hundreds of MB). The
        GETs may run on Arrow's IO threads (``pre_buffer``), which their CPU time is
        then charged to: a check is not a timed read."""
        import pyarrow.parquet as pq

        assert self.store is not None
        source = store_shards.RangedShard(self.store, path, WHAT, self.learned(path).bytes)
        first = 0
        try:
            with pq.ParquetFile(source, pre_buffer=True) as table:
                for group in range(table.metadata.num_row_groups):
                    rows = table.read_row_group(group, columns=list(self.columns)).to_pylist()
                    for number, values in enumerate(rows, first):
                        yield {**values, "__url__": path, "__row__": number}
                    first += len(rows)
        except read_errors() as exc:
            raise unreadable(path, exc) from None

    def read(
        self, path: str, start: int, stop: int, blob: bytes | Pieces | None = None
    ) -> Iterator[dict[str, Any]]:
        if blob is None:
            blob = self.fetch(path, start, stop)
        try:
            yield from super().read(path, start, stop, blob)
        except read_errors() as exc:
            if not isinstance(blob, Pieces):
                raise
            raise DatasetError(
                f"hf: rows {start} to {stop} of {path} could not be read from the bytes "
                f"fetched for them ({last_line(exc)}); if the file changed since the search "
                "counted it, run the search again on the data as it is now"
            ) from None


@dataclass(frozen=True)
class Columns:
    """The columns a file is checked for (the part of a Spec :func:`check_columns` reads)."""

    image_column: str
    label_column: str


def label_names(schema: Any, column: str) -> tuple[str, ...] | None:
    """A ClassLabel's names, as HF records its features in a Parquet file's schema (the
    ``huggingface`` metadata ``Dataset.to_parquet`` writes); None where it records none."""
    try:
        features = json.loads((schema.metadata or {})[b"huggingface"])["info"]["features"]
        names = features[column]["names"]
    except (KeyError, TypeError, ValueError):
        return None
    return tuple(str(n) for n in names) if isinstance(names, list) and names else None


def classes_of(facts: Sequence[Facts]) -> list[str]:
    """The classes of files in a store: a ClassLabel's names, else one class per index up
    to the largest label read (as :func:`_classes` makes them of local files)."""
    named = next((f.names for f in facts if f.names), None)
    if named:
        return list(named)
    return [str(i) for i in range(max((f.top_label for f in facts), default=0) + 1)]
