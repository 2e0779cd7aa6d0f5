"""An ImageFolder as webdataset tar shards and as Parquet files (a Hugging Face table).

Point it at your own ImageFolder (``<root>/<class>/<image>``) to try the streaming
sources on your images, or leave it at the embedded default dataset:

    python experiments/to_shards.py [--images DIR] [--out DIR] [--shards 8]

Writes ``OUT/webdataset/shard-NNNN.tar`` (one ``jpg`` and one ``cls`` per sample, in
a seeded order, as webdataset's writers do) and ``OUT/parquet/part-NNNN.parquet``
(an ``image`` column of Hugging Face's ``Image`` feature, bytes and file name, and a
``label`` ``ClassLabel``), each split into ``--shards`` files. Search them with
``--dataset webdataset --data-root OUT/webdataset`` and ``--dataset hf --data-root
OUT/parquet``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import tarfile
from pathlib import Path

from _common import default_job


def images_of(root: Path) -> tuple[list[Path], list[int], list[str]]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.parent.name in classes)
    random.Random(0).shuffle(files)  # shards hold every class, as shuffled writers make them
    return files, [classes.index(f.parent.name) for f in files], classes


def write_webdataset(files: list[Path], labels: list[int], out: Path, shards: int) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"shard-{i:04d}.tar" for i in range(shards)]
    with contextlib.ExitStack() as stack:
        tars = [stack.enter_context(tarfile.open(path, "w")) for path in paths]
        for index, (file, label) in enumerate(zip(files, labels, strict=True)):
            ext = file.suffix.lower().lstrip(".").replace("jpeg", "jpg")
            for name, data in ((f"{index:08d}.{ext}", file.read_bytes()),
                               (f"{index:08d}.cls", str(label).encode())):  # fmt: skip
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tars[index * shards // len(files)].addfile(info, io.BytesIO(data))
    return paths


def write_parquet(
    files: list[Path],
    labels: list[int],
    classes: list[str],
    out: Path,
    shards: int,
    row_group: int | None = None,
) -> list[Path]:
    """``shards`` Parquet files of the images, as ``Dataset.to_parquet`` writes them
    (``row_group`` rows a row group; its own choice, 100 for images, where None)."""
    import datasets

    rows = datasets.Dataset.from_dict(
        {"image": [{"bytes": f.read_bytes(), "path": f.name} for f in files], "label": labels},
        features=datasets.Features(
            image=datasets.Image(), label=datasets.ClassLabel(names=classes)
        ),
    )
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"part-{i:04d}.parquet" for i in range(shards)]
    for i, path in enumerate(paths):
        part = rows.shard(shards, i, contiguous=True)
        part.to_parquet(str(path), **({"batch_size": row_group} if row_group else {}))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=Path, help="an ImageFolder (default: the embedded one)")
    parser.add_argument("--out", type=Path, default=Path("data/shards"))
    parser.add_argument("--shards", type=int, default=8)
    args = parser.parse_args()
    root = args.images or Path(default_job().dataset.resolved_root() or "") / "train"
    files, labels, classes = images_of(root)
    tars = write_webdataset(files, labels, args.out / "webdataset", args.shards)
    parquet = write_parquet(files, labels, classes, args.out / "parquet", args.shards)
    print(f"{len(files)} images of {len(classes)} classes from {root}:")
    print(f"  {len(tars)} webdataset shards in {args.out / 'webdataset'}")
    print(f"  {len(parquet)} Parquet files in {args.out / 'parquet'}")


if __name__ == "__main__":
    main()
