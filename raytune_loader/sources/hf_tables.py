"""Hugging Face tables: ``--dataset hf --data-root DIR``.

DIR is a dataset written by ``save_to_disk`` (a ``DatasetDict``, whose ``train`` split
is read, or a ``Dataset``) or a folder of ``.parquet`` files, read with the ``datasets``
package (``pip install datasets``) in HF's offline mode: nothing is fetched from a hub.
Each row has an image column (``--image-column``: HF's ``Image`` feature, bytes or a
path, or plain bytes or paths) and a label column (``--label-column``: a ``ClassLabel``
or integers). The images are decoded here, not by HF (``Image(decode=False)``), with
the ImageNet training transforms of the chosen pipeline variant: by PIL or to tensors
in the workers, or, JPEGs, on the device.

It is read either way, a searched choice (``access``). Map-style, by index: the
``save_to_disk`` Arrow files memory-mapped, or the Parquet files through HF's Arrow
cache (``load_dataset("parquet")`` converts them once, as training with it would). As
a stream, over the trial's shards (the dataset's Arrow files, or the Parquet files
themselves), read with pyarrow a record batch at a time (a Parquet file's row groups
before a span are skipped) as a :class:`ShardStream` plans them: every rank its own
rows and as many batches as every other rank, each loader worker, process or thread,
whole batches of them (Hugging Face's own ``split_dataset_by_node`` splits by file,
or rank by rank every row, and cannot see a spawned worker's rank). Rows pass the
user's shuffle buffer (the files' order shuffled too), never shrunk (a trial's holds
at most a worker's pass over its files: :class:`ShardStream`). The loader makes
the batches: batching in the workers is not a candidate for this source. The
map-style subset is not pre-warmed: its rows lie scattered through the Arrow files,
and reading the files whole could mean reading the whole dataset.

Parquet files in an object store (``s3://bucket/prefix``, whose ``.parquet`` objects
are the files, or a brace pattern ``s3://bucket/part-{00000..00015}.parquet``) are read
where they live, as a stream only: each span's row groups and the file's footer
fetched by ranged GETs (:class:`~raytune_loader.sources.table_files.RemoteFiles`),
``fetch_threads`` spans ahead in each worker. Their image cells must hold the bytes
(a path would name a file elsewhere). The driver reads each file once to count and
check it, and hands what it learned (rows, classes) to the trials' processes; nothing
is converted into a local cache.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.utils.data import Dataset, IterableDataset

from raytune_loader.errors import CorruptSampleError, DatasetError, last_line
from raytune_loader.loaders.shard_stream import RayRead, ShardStream, StreamVariant
from raytune_loader.pipeline.transforms import worker_image
from raytune_loader.sources import store_shards
from raytune_loader.sources import table_files as tf
from raytune_loader.sources.base import ShardInfo, Source, Spec, prewarm
from raytune_loader.sources.store_shards import ShardListing
from raytune_loader.stores.url import is_remote

if TYPE_CHECKING:
    from raytune_loader.progress import Progress

INSTALL = "pip install datasets"
OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
WHAT = tf.WHAT
EXAMPLE = "part-{00000..00015}.parquet"


def _datasets() -> Any:
    """HF's ``datasets``, offline. The variables are set before its first import in
    this process (every process that reads the source, Ray's workers included, comes
    through here; the processes it starts inherit them), and its settings too, for a
    process that imported it before. Set here rather than when the package is
    imported: a training script that imports raytune_loader keeps its hub access."""
    for name in OFFLINE:
        os.environ[name] = "1"
    try:
        import datasets
        import datasets.distributed
        import huggingface_hub.constants
    except ImportError:
        raise DatasetError(f"--dataset hf needs the datasets package: {INSTALL}") from None
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    return datasets


@dataclass(frozen=True)
class _Layout:
    """What DIR holds: ``arrow`` (``save_to_disk``) or ``parquet`` files, in order."""

    kind: str
    folder: str  # the saved split's folder, or the Parquet folder (or prefix, in a store)
    files: tuple[str, ...]


def _layout(spec: Spec) -> _Layout:
    if not spec.data_root:
        raise DatasetError(
            "hf needs --data-root: a folder written by save_to_disk, or a folder of .parquet files"
        )
    if is_remote(spec.data_root):
        return _Layout("parquet", str(spec.data_root), _in_store(spec))
    root = Path(spec.data_root)
    if not root.is_dir():
        raise DatasetError(f"hf: {root} is not a folder")
    split = _saved_split(root)
    if split is not None:
        state = json.loads((split / "state.json").read_text())
        files = tuple(str(split / f["filename"]) for f in state["_data_files"])
        return _Layout("arrow", str(split), files)
    parquet = tuple(sorted(str(p) for p in root.glob("*.parquet")))
    if not parquet:
        raise DatasetError(
            f"hf: {root} holds neither a dataset written by save_to_disk (dataset_dict.json "
            "or state.json) nor .parquet files"
        )
    return _Layout("parquet", str(root), parquet)


def _saved_split(root: Path) -> Path | None:
    if (root / "dataset_dict.json").is_file():
        splits = json.loads((root / "dataset_dict.json").read_text()).get("splits", [])
        if "train" not in splits:
            raise DatasetError(
                f"hf: {root} is a DatasetDict without a train split (it has "
                f"{', '.join(splits) or 'none'}); point --data-root at the split's folder"
            )
        return root / "train"
    return root if (root / "state.json").is_file() else None


class HuggingFaceTables(Source):
    """A Hugging Face ``save_to_disk`` folder or Parquet files, read by index or as a stream,
    the search choosing."""

    names = ("hf",)
    summary = "a Hugging Face datasets folder (save_to_disk) or Parquet files under --data-root"

    def accesses(self, spec: Spec) -> tuple[str, ...]:
        # in a store, read as a stream: by index would mean a local copy of every file
        return ("stream",) if is_remote(spec.data_root) else ("map", "stream")

    def ray_data_reads(self, spec: Spec) -> bool:
        # Parquet through ray.data.read_parquet (in a bucket, through Arrow's S3
        # filesystem: stores.arrow), save_to_disk's rows by index
        return True

    def fetches(self, spec: Spec) -> bool:
        return is_remote(spec.data_root)

    def listed(self, spec: Spec) -> ShardListing | None:
        """For files in a store: what this process listed and learned of them, to hand on."""
        if not is_remote(spec.data_root):
            return None
        return store_shards.listing_for(spec, _in_store(spec))

    def files(self, dataset: Dataset, indices: list[int]) -> list[str]:
        return []  # its tables are read through once as they are counted and checked

    def pipeline_searched(self, spec: Spec) -> bool:
        return True

    def shards(self, spec: Spec) -> list[str]:
        return list(_layout(spec).files)

    def prepare(self, spec: Spec, progress: Progress) -> None:
        """Parquet files are read into HF's Arrow cache once, here, for map-style reads
        (a large folder takes a while); their footers are checked first."""
        layout = _layout(spec)
        if layout.kind == "parquet" and not is_remote(spec.data_root):
            progress.stage(
                f"Reading {len(layout.files)} Parquet files into Hugging Face's Arrow cache "
                "(for map-style reads; once)"
            )
            self.build(spec)

    def decoders(self, spec: Spec, cuda: bool) -> tuple[str, ...]:
        found = ("pil", "tensor")
        if not cuda:
            return found
        layout, store = _layout(spec), store_shards.bucket_for(spec)
        try:
            blob = store_shards.fetched(store, layout.files[0], WHAT) if store else None
            batch = next(tf.batches(layout.files[0], [spec.image_column], blob=blob), [])
            first = _image_bytes(batch.column(0)[0].as_py(), layout.folder) if batch else b""
        except (DatasetError, CorruptSampleError, *tf.read_errors()):
            return found  # the shard checks or the trials say what is wrong
        return (*found, "device") if first[:3] == b"\xff\xd8\xff" else found

    def read_shard(self, spec: Spec, path: str) -> ShardInfo:
        store = store_shards.bucket_for(spec)
        if store is not None:  # fetched, checked and counted once; kept to hand on
            facts = tf.RemoteFiles((spec.image_column, spec.label_column), store).learned(path)
            return ShardInfo(path, facts.rows, facts.bytes)
        size = prewarm([path])
        tf.check_file(spec, path)
        try:  # every row read through, a batch at a time
            rows = sum(len(b) for b in tf.batches(path, [spec.image_column, spec.label_column]))
        except tf.read_errors() as exc:
            raise tf.unreadable(path, exc) from None
        return ShardInfo(path, rows, size)

    def build(self, spec: Spec, transfer: str = "float32", decode: str = "pil") -> Dataset:
        if is_remote(spec.data_root):
            raise DatasetError(
                f"hf: {spec.data_root} is in an object store, read as a stream: build it "
                "with access='stream' (by index would need a local copy of every file)"
            )
        hf = _datasets()
        layout = _layout(spec)
        columns = [spec.image_column, spec.label_column]
        if layout.kind == "arrow":
            table = hf.load_from_disk(layout.folder)
            tf.check_columns(spec, str(layout.folder), table.data.schema)
        else:
            for path in layout.files:  # their footers: a file HF cannot read is named
                tf.check_file(spec, path)
            table = _converted(hf, spec, layout)
        table = _undecoded(hf, table.select_columns(columns), spec.image_column)
        classes = _classes(table.features, spec.label_column, [table.data.column(columns[1])])
        return _Rows(table, _decoder(spec, layout, transfer, decode), layout.files, classes)

    def build_stream(
        self, spec: Spec, shards: list[str], variant: StreamVariant
    ) -> IterableDataset:
        hf = _datasets()
        layout = _layout(spec)
        shards = shards or list(layout.files)
        columns = (spec.image_column, spec.label_column)
        decoded = _Named(_decoder(spec, layout, variant.transfer, variant.decode), spec.data_root)
        common = {"shuffle_buffer": variant.shuffle_buffer, "seed": variant.seed,
                  "repeat": variant.repeat, "batch_size": variant.batch_size}  # fmt: skip
        store = store_shards.bucket_for(spec)
        if store is not None:
            facts = store_shards.counted(tf.RemoteFiles(columns, store).learned, shards, True)
            files = tf.RemoteFiles(columns, store, dict(zip(shards, facts, strict=True)))
            sizes = [f.rows for f in facts]
            return ShardStream(
                shards, sizes, files, decoded, classes=tf.classes_of(facts), **common
            )
        for path in shards:
            tf.check_file(spec, path)
        try:
            sizes = [tf.row_count(path) for path in shards]
        except tf.read_errors() as exc:
            raise DatasetError(f"hf: a file under {layout.folder} is unreadable: {exc}") from None
        names = getattr(_features(hf, shards[0]).get(spec.label_column), "names", None)
        classes = list(names) if names else _classes(
            None, spec.label_column,
            [b.column(0) for path in shards for b in tf.batches(path, [spec.label_column])],
        )  # fmt: skip
        return ShardStream(
            shards, sizes, tf.TableShards(columns), decoded, classes=classes, **common
        )

    def describe(self, spec: Spec) -> dict[str, Any]:
        layout = _layout(spec)
        found: dict[str, Any] = {
            "kind": "hf",
            "format": layout.kind,
            "shards": len(layout.files),
            "image_column": spec.image_column,
            "label_column": spec.label_column,
        }
        store = store_shards.bucket_for(spec)
        if store is not None:
            found["store"] = store.describe()
        return found


def _in_store(spec: Spec) -> tuple[str, ...]:
    """The Parquet files a store's prefix or pattern names."""
    return store_shards.named_for(spec, ".parquet", WHAT, EXAMPLE)


def _converted(hf: Any, spec: Spec, layout: _Layout) -> Any:
    """The Parquet files as one map-style dataset, through HF's Arrow cache."""
    try:
        with _quiet(hf):
            return hf.load_dataset(
                "parquet", data_files=list(layout.files), split="train",
                columns=[spec.image_column, spec.label_column],
            )  # fmt: skip
    except hf.exceptions.DatasetGenerationError as exc:  # a page that does not decompress
        raise DatasetError(
            f"hf: the Parquet files under {layout.folder} could not be read: "
            f"{last_line(exc.__cause__ or exc)}"
        ) from None


@contextlib.contextmanager
def _quiet(hf: Any) -> Iterator[None]:
    """Without HF's progress bars: the search's console says what happens."""
    shown = not hf.are_progress_bars_disabled()
    hf.disable_progress_bars()
    try:
        yield
    finally:
        if shown:
            hf.enable_progress_bars()


def _undecoded(hf: Any, rows: Any, column: str) -> Any:
    """An ``Image`` column as its stored bytes or path (``Image(decode=False)``): the
    pipeline variant decodes. Other columns (plain bytes, paths) are read as stored."""
    if isinstance((rows.features or {}).get(column), hf.Image):
        return rows.cast_column(column, hf.Image(decode=False))
    return rows


def _classes(features: Any, column: str, labels: list[Any]) -> list[str]:
    """A ClassLabel's names, else one class per index up to the largest label read."""
    names = getattr((features or {}).get(column), "names", None)
    if names:
        return list(names)
    import pyarrow.compute as pc

    top = max((pc.max(values).as_py() or 0 for values in labels), default=0)
    return [str(i) for i in range(top + 1)]


def _image_bytes(cell: Any, folder: str) -> bytes:
    """An image cell's encoded bytes: HF's ``Image`` storage (``bytes``, ``path``),
    bytes, or a path (a relative one from the dataset's folder)."""
    if isinstance(cell, dict):
        data, path = cell.get("bytes"), cell.get("path")
    elif isinstance(cell, (bytes, bytearray, memoryview)):
        data, path = cell, None
    else:
        data, path = None, cell
    if data:
        return bytes(data)
    if not path:
        raise CorruptSampleError("it has neither image bytes nor a path")
    try:
        return Path(folder, path).read_bytes()
    except OSError as exc:
        raise CorruptSampleError(f"its image {path}: {exc.strerror}") from None


@dataclass(frozen=True)
class _Decoded:
    """A row as ``(image, label)`` with the variant's worker side; a picklable callable,
    for worker processes started by spawn."""

    image_column: str
    label_column: str
    folder: str
    transfer: str
    decode: str

    def __call__(self, row: dict[str, Any]) -> tuple[Any, int]:
        label = row[self.label_column]
        if not isinstance(label, int):
            raise CorruptSampleError(f"its label is {label!r}, not a class index")
        data = _image_bytes(row[self.image_column], self.folder)
        return worker_image(data, self.transfer, self.decode), label


def _decoder(spec: Spec, layout: _Layout, transfer: str, decode: str) -> _Decoded:
    return _Decoded(spec.image_column, spec.label_column, str(layout.folder), transfer, decode)


class _Rows(Dataset):  # type: ignore[type-arg]
    """The table by index, as ``(image, label)``; a row that fails names its file."""

    def __init__(self, table: Any, decoded: _Decoded, files: tuple[str, ...], classes: list[str]):
        self.table = table
        self.decoded = decoded
        self.files = files
        self.classes = classes

    def __len__(self) -> int:
        return len(self.table)

    def ray_read(self) -> RayRead | None:
        """The whole table as Ray Data reads it: its Parquet files with ``read_parquet``
        (each row once an epoch); None for ``save_to_disk``'s Arrow files, which Ray
        Data's actors read by index instead."""
        if not self.files or not all(p.endswith(".parquet") for p in self.files):
            return None
        columns = (self.decoded.image_column, self.decoded.label_column)
        named = _Named(self.decoded, self.decoded.folder)
        return RayRead("parquet", self.files, len(self.table), named, columns)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        try:
            return self.decoded(self.table[index])
        except CorruptSampleError as exc:
            where = _row_in_files(self.files, index)
            raise CorruptSampleError(f"corrupt sample {where}: {exc}") from None


def _row_in_files(files: tuple[str, ...], index: int) -> str:
    """Which file and row a row of the whole table is (its files hold it in order)."""
    start = 0
    for path in files:
        rows = tf.row_count(path)
        if index < start + rows:
            return f"{path}, row {index - start}"
        start += rows
    return f"row {index}"


def _features(hf: Any, path: str) -> Any:
    """HF's features of one file (a ClassLabel's names), as its schema records them."""
    import pyarrow.parquet as pq

    if path.endswith(".parquet"):
        return hf.Features.from_arrow_schema(pq.read_schema(path))
    return hf.Dataset.from_file(path).features


@dataclass(frozen=True)
class _Named:
    """A row decoded; one that fails names its image, or its file and row."""

    decoded: _Decoded
    root: str | None

    def __call__(self, row: dict[str, Any]) -> tuple[Any, int]:
        try:
            return self.decoded(row)
        except CorruptSampleError as exc:
            raise CorruptSampleError(
                f"corrupt sample in {self.root} ({_which(row, self.decoded)}): {exc}"
            ) from None


def _which(row: dict[str, Any], decoded: _Decoded) -> str:
    """A failed row's image, or its file (and row, where the reader says it: Ray Data's
    ``read_parquet`` gives the file alone, as ``path``)."""
    cell = row.get(decoded.image_column)
    image = cell.get("path") if isinstance(cell, dict) else None
    if image:
        return f"image {image}"
    url = row.get("__url__", row.get("path", "?"))
    return f"{url}, row {row['__row__']}" if "__row__" in row else str(url)


SOURCE = HuggingFaceTables()
