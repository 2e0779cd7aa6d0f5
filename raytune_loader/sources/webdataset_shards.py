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
shuffled too) as training would; the buffer is the user's, never shrunk. Batches
are made by the loader or in each worker, a searched choice.
"""

from __future__ import annotations

import glob
import os
import re
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset, IterableDataset, default_collate

from raytune_loader.errors import CorruptSampleError, DatasetError, last_line
from raytune_loader.loaders.shard_stream import ShardStream, StreamVariant
from raytune_loader.pipeline.transforms import worker_image
from raytune_loader.sources.base import ShardInfo, Source, Spec

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
LABEL_KEY = "cls"
INSTALL = "pip install webdataset"


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
        return True  # the trial's shards through ray.data.read_webdataset (ShardStream.ray_read)

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
        if Path(root).is_dir():
            found = sorted(glob.glob(os.path.join(root, "*.tar")))
        else:
            found = [p for p in _webdataset().shardlists.expand_urls(root) if Path(p).is_file()]
        if not found:
            raise DatasetError(f"webdataset: {root} matches no .tar shard")
        return found

    def decoders(self, spec: Spec, cuda: bool) -> tuple[str, ...]:
        found = ("pil", "tensor")
        if not cuda:
            return found
        first = _first_image(self.shards(spec)[0])
        return (*found, "device") if first[:3] == b"\xff\xd8\xff" else found

    def read_shard(self, spec: Spec, path: str) -> ShardInfo:
        samples: dict[str, set[str]] = {}
        member = "its first member"
        try:
            with tarfile.open(path, "r|*") as tar:
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
        return ShardInfo(path, len(samples), Path(path).stat().st_size)

    def build_stream(
        self, spec: Spec, shards: list[str], variant: StreamVariant
    ) -> IterableDataset:
        from raytune_loader.pipeline.device import collate_encoded

        _webdataset()  # installed, or the error says how
        shards = shards or self.shards(spec)
        reader = _TarShards()
        collate = collate_encoded if variant.decode == "device" else default_collate
        return ShardStream(
            shards, [reader.count(path) for path in shards], reader,
            _Decoded(variant.transfer, variant.decode), shuffle_buffer=variant.shuffle_buffer,
            seed=variant.seed, repeat=variant.repeat, batch_size=variant.batch_size,
            collate=collate,
        )  # fmt: skip

    def describe(self, spec: Spec) -> dict[str, Any]:
        return {"kind": "webdataset", "shards": len(self.shards(spec))}


_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta


@dataclass(frozen=True)
class _TarShards:
    """Reads tar shards as webdataset groups them: the files of one key in a row are a
    sample (``{"__key__", "__url__", ext: bytes}``). Members are walked lazily, seeking
    past the data of the samples before a span; picklable, for spawned workers."""

    def count(self, path: str) -> int:
        return sum(1 for _ in _keyed(path, read=False))

    def read(self, path: str, start: int, stop: int) -> Iterator[dict[str, Any]]:
        for index, sample in enumerate(_keyed(path, read=True, first=start)):
            if index >= stop - start:
                return
            yield sample

    def ray_reader(self, paths: Sequence[str]) -> str | None:
        return "webdataset"  # ray.data.read_webdataset groups members by webdataset's rule


def _keyed(path: str, *, read: bool, first: int = 0) -> Iterator[dict[str, Any]]:
    """The shard's samples from the ``first``-th on (their data read with ``read``)."""
    from webdataset.tariterators import base_plus_ext

    index, key, members = -1, None, []
    try:
        with tarfile.open(path, "r:*") as tar:
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


def _first_image(path: str) -> bytes:
    with tarfile.open(path, "r|*") as tar:
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
