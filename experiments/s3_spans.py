"""What a worker's span of a tar shard or a Parquet file fetches from a store: its own
bytes, or the whole object.

    python experiments/s3_spans.py [--format webdataset|parquet] [--images 512]
                                   [--shards 8] [--rounds 7]

The default dataset's JPEG files as webdataset tar shards, or as Parquet files of row
groups of 16 rows (experiments/to_shards.py's writers), in moto's S3 on loopback behind
the tests' proxy (tests/s3_for_tests.py), 30 ms to each request's first byte and 100
Mbit/s a request. One epoch of the stream, batches of 16, read by 2, 3 and 4 loader
workers (process workers, 2 spans ahead each), with the spans as the product reads
them and with whole objects, the two alternating in each of ``--rounds`` rounds. A
tar shard's span is a ranged GET of its samples, from the shard's index; whole, the
proxy ignores Range (every span's GET answers its whole shard, as before the index).
A Parquet file's span is ranged GETs of its row groups and its footer; whole, the
counts hold no row groups (every span is one GET of its file). Recorded: the bytes
the store sent and its GETs for an epoch (the same every round), the epoch's median
seconds, and the ratios. Three workers cut two objects among them (each worker's
share is whole batches: 11, 11 and 10 of 32), so the whole reads fetch those twice;
two and four workers split on object boundaries, where both fetch the same. Writes
results/benchmarks/s3_spans.json (tar shards) or s3_spans_parquet.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.loaders.shard_stream import StreamVariant
from raytune_loader.sources import store_shards, synthetic
from raytune_loader.sources.datasets import DatasetSpec
from to_shards import images_of, write_parquet, write_webdataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the server

BUCKET = "spans"
TTFB_S = 0.030
BYTES_PER_S = 100e6 / 8  # 100 Mbit/s a request
WORKERS = (2, 3, 4)
BATCH = 16
ROW_GROUP = 16  # rows: a Parquet file of 64 images holds 4 row groups
_GROUPS: dict[str, Any] = {}  # each Parquet file's row groups, as counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=("webdataset", "parquet"), default="webdataset")
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    from s3_for_tests import S3Server, environment

    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, S3Server(TTFB_S, BYTES_PER_S) as server:
        root = synthetic.ensure_synthetic_imagenet(Path(tmp) / "data", args.images, 10, 2)
        files, labels, classes = images_of(root / "train")
        if args.format == "parquet":
            shards = write_parquet(files, labels, classes, Path(tmp) / "shards", args.shards,
                                   ROW_GROUP)  # fmt: skip
            spec = DatasetSpec("hf", f"s3://{BUCKET}/objects")
        else:
            shards = write_webdataset(files, labels, Path(tmp) / "shards", args.shards)
            spec = DatasetSpec("webdataset", f"s3://{BUCKET}/objects/"
                               f"shard-{{0000..{args.shards - 1:04d}}}.tar")  # fmt: skip
        server.upload_folder(shards[0].parent, BUCKET, "objects")
        with environment(server.env()):
            stream = spec.source.build_stream(  # counted and indexed once, here
                spec, spec.source.shards(spec), StreamVariant("uint8", "tensor")
            )
            runs: dict[tuple[int, str], list[dict[str, float]]] = {}
            try:
                _rounds(args, stream, server, runs)
            finally:
                _read_whole(False, args.format, server, stream)
        for workers in WORKERS:
            row = {way: _summary(runs[(workers, way)]) for way in ("ranged", "whole")}
            row["bytes_ratio"] = round(row["ranged"]["bytes"] / row["whole"]["bytes"], 3)
            row["speedup"] = round(row["whole"]["epoch_s"] / row["ranged"]["epoch_s"], 3)
            found[f"{workers}_workers"] = row
        shard_bytes = sum(p.stat().st_size for p in shards)
    name = "s3_spans_parquet" if args.format == "parquet" else "s3_spans"
    save(name, {"format": args.format, "images": args.images, "shards": args.shards,
                "row_group": ROW_GROUP if args.format == "parquet" else None,
                "batch_size": BATCH, "shards_bytes": shard_bytes, "ttfb_s": TTFB_S,
                "mbit_per_s_per_request": BYTES_PER_S * 8 / 1e6,
                "rounds": args.rounds, "epochs": found})  # fmt: skip


def _rounds(args: Any, stream: Any, server: Any, runs: dict[Any, list[Any]]) -> None:
    """``args.rounds`` rounds of an epoch by each number of workers, each read both
    ways, in turn first."""
    for round_ in range(args.rounds):
        for workers in WORKERS:
            ways = ("ranged", "whole") if round_ % 2 == 0 else ("whole", "ranged")
            for way in ways:
                _read_whole(way == "whole", args.format, server, stream)
                runs.setdefault((workers, way), []).append(_epoch(stream, workers, server))
                print(f"round {round_ + 1}, {workers} workers, {way}: "
                      f"{runs[(workers, way)][-1]}", flush=True)  # fmt: skip


def _read_whole(whole: bool, format_: str, server: Any, stream: Any) -> None:
    """Every span reads its whole object (``whole``) or its own bytes: a tar shard's
    through the proxy ignoring Range; a Parquet file's through counts that hold no row
    groups, this process's (forked workers inherit them) and those its reader carries
    (spawned ones')."""
    if format_ == "webdataset":
        server.proxy.ranges = not whole
        return
    for counts in (store_shards.COUNTED, stream.reader.known):
        for url, facts in list(counts.items()):
            kept = _GROUPS.setdefault(url, facts.groups)
            counts[url] = facts._replace(groups=() if whole else kept)


def _epoch(stream: Any, workers: int, server: Any) -> dict[str, float]:
    """One epoch of ``stream`` by ``workers`` process workers: its seconds, and the
    bytes and GETs the store answered."""
    config = LoaderConfig.from_dict(
        {"num_workers": workers, "fetch_threads": 2, "access": "stream"}, batch_size=BATCH
    )
    assert store_shards.COUNTED, "the stream's shards are indexed before the epoch"
    loader = build_dataloader(stream, config, seed=1, drop_last=False)
    sent, gets = server.proxy.sent, server.proxy.gets
    started = time.perf_counter()
    samples = sum(len(labels) for _, labels in loader)
    seconds = time.perf_counter() - started
    return {"samples": samples, "epoch_s": round(seconds, 3),
            "bytes": server.proxy.sent - sent, "gets": server.proxy.gets - gets}  # fmt: skip


def _summary(runs: list[dict[str, float]]) -> dict[str, float]:
    """The rounds' bytes and GETs (one epoch's: the same each round) and median seconds."""
    assert len({(r["bytes"], r["gets"], r["samples"]) for r in runs}) == 1, runs
    return {"samples": runs[0]["samples"], "bytes": runs[0]["bytes"], "gets": runs[0]["gets"],
            "epoch_s": round(statistics.median(r["epoch_s"] for r in runs), 3)}  # fmt: skip


if __name__ == "__main__":
    main()
