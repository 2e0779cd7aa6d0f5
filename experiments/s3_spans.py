"""What a worker's span of a tar shard fetches from a store: its own samples' bytes, or
the whole shard.

    python experiments/s3_spans.py [--images 512] [--shards 8] [--rounds 7]

The default dataset's JPEG files as webdataset tar shards (experiments/to_shards.py's
writer) in moto's S3 on loopback behind the tests' proxy (tests/s3_for_tests.py), 30 ms
to each request's first byte and 100 Mbit/s a request. One epoch of the stream, batches
of 16, read by 2, 3 and 4 loader workers (process workers, 2 spans ahead each), with
the spans as the product reads them (a ranged GET of a span's samples, from the
shard's index) and with the proxy ignoring Range (every span's GET answers its whole
shard, as before the index), the two alternating in each of ``--rounds`` rounds.
Recorded: the bytes the store sent and its GETs for an epoch (the same every round),
the epoch's median seconds, and the ratios. Three workers cut two shards among them
(each worker's share is whole batches: 11, 11 and 10 of 32), so the whole-shard
reads fetch those twice; two and four workers split on shard boundaries, where both
fetch the same. Writes results/benchmarks/s3_spans.json.
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
from to_shards import images_of, write_webdataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the server

BUCKET = "spans"
TTFB_S = 0.030
BYTES_PER_S = 100e6 / 8  # 100 Mbit/s a request
WORKERS = (2, 3, 4)
BATCH = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    from s3_for_tests import S3Server, environment

    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, S3Server(TTFB_S, BYTES_PER_S) as server:
        root = synthetic.ensure_synthetic_imagenet(Path(tmp) / "data", args.images, 10, 2)
        files, labels, _ = images_of(root / "train")
        shards = write_webdataset(files, labels, Path(tmp) / "shards", args.shards)
        server.upload_folder(shards[0].parent, BUCKET, "wds")
        pattern = f"s3://{BUCKET}/wds/shard-{{0000..{args.shards - 1:04d}}}.tar"
        spec = DatasetSpec("webdataset", pattern)
        with environment(server.env()):
            stream = spec.source.build_stream(  # counted and indexed once, here
                spec, spec.source.shards(spec), StreamVariant("uint8", "tensor")
            )
            runs: dict[tuple[int, str], list[dict[str, float]]] = {}
            for round_ in range(args.rounds):
                for workers in WORKERS:
                    ways = ("ranged", "whole") if round_ % 2 == 0 else ("whole", "ranged")
                    for way in ways:
                        server.proxy.ranges = way == "ranged"
                        runs.setdefault((workers, way), []).append(_epoch(stream, workers, server))
                        print(f"round {round_ + 1}, {workers} workers, {way}: "
                              f"{runs[(workers, way)][-1]}", flush=True)  # fmt: skip
        for workers in WORKERS:
            row = {way: _summary(runs[(workers, way)]) for way in ("ranged", "whole")}
            row["bytes_ratio"] = round(row["ranged"]["bytes"] / row["whole"]["bytes"], 3)
            row["speedup"] = round(row["whole"]["epoch_s"] / row["ranged"]["epoch_s"], 3)
            found[f"{workers}_workers"] = row
        shard_bytes = sum(p.stat().st_size for p in shards)
    save("s3_spans", {"images": args.images, "shards": args.shards, "batch_size": BATCH,
                      "shards_bytes": shard_bytes, "ttfb_s": TTFB_S,
                      "mbit_per_s_per_request": BYTES_PER_S * 8 / 1e6,
                      "rounds": args.rounds, "epochs": found})  # fmt: skip


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
