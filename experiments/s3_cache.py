"""What a local cache of a bucket's objects changes, epoch by epoch.

    python experiments/s3_cache.py [--ttfb 0.03] [--images 512] [--epochs 3] [--rounds 3]

The default dataset's JPEG files as single objects in moto's S3 behind the tests'
proxy (``--ttfb`` to the first byte, 100 Mbit/s a request), read by the loader a
search tunes on a bucket here (2 worker processes, 16 requests in flight each, uint8
tensors, batch 16) with and without the cache (``cache``), ``--epochs`` epochs each,
in ``--rounds`` rotated rounds; each round's cache starts empty in a folder of its own.
Every epoch's samples/s (the loader alone: the input pipeline, no model) and its
requests are recorded; the ratios are the medians': the cache's first, cold epoch
against an epoch without the cache (the cost of writing the files), and its warm
epochs against both. Writes results/benchmarks/s3_cache.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from s3_search import BUCKET, _server, _upload

from _common import save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.sources import synthetic
from raytune_loader.sources.datasets import DatasetSpec, build_dataset
from raytune_loader.stores.cache import ObjectCache
from raytune_loader.stores.store import count_requests

LOADER = {"num_workers": 2, "fetch_threads": 16, "transfer": "uint8", "decode": "tensor",
          "persistent_workers": True}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ttfb", type=float, default=0.03)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[list[dict[str, Any]]]] = {"no_cache": [], "cache": []}
    with tempfile.TemporaryDirectory() as tmp, _server((args.ttfb,)) as (moto, proxy):
        root = synthetic.ensure_synthetic_imagenet(Path(tmp) / "data", args.images, 10, 2)
        _upload(root / "train", moto)
        os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": proxy})  # fmt: skip
        spec = DatasetSpec("imagenet", f"s3://{BUCKET}/imagenet")
        for round_ in range(args.rounds):
            order = ("no_cache", "cache") if round_ % 2 == 0 else ("cache", "no_cache")
            for name in order:
                folder = Path(tmp) / f"cache-{round_}"
                runs[name].append(_epochs(spec, name == "cache", folder, args.epochs))
                print(round_, name, [e["samples_per_s"] for e in runs[name][-1]], flush=True)

    def median(name: str, epoch: int) -> float:
        return statistics.median(r[epoch]["samples_per_s"] for r in runs[name])

    plain = statistics.median(e["samples_per_s"] for r in runs["no_cache"] for e in r)
    warm = statistics.median(e["samples_per_s"] for r in runs["cache"] for e in r[1:])
    save("s3_cache", {
        "ttfb_s": args.ttfb, "images": args.images, "epochs": args.epochs,
        "rounds": args.rounds, "loader": LOADER, "runs": runs,
        "no_cache_samples_per_s": round(plain, 1),
        "cold_samples_per_s": round(median("cache", 0), 1),
        "warm_samples_per_s": round(warm, 1),
        "cold_vs_no_cache": round(median("cache", 0) / plain, 3),
        "warm_vs_no_cache": round(warm / plain, 3),
        "warm_vs_cold": round(warm / median("cache", 0), 3),
    })  # fmt: skip


def _epochs(spec: DatasetSpec, cache: bool, folder: Path, epochs: int) -> list[dict[str, Any]]:
    """Each epoch's samples/s and GETs, for the loader with or without a cache in
    ``folder`` (empty at the start)."""
    dataset = build_dataset(spec, "uint8", "tensor")
    if cache:
        dataset.keep_objects(True, ObjectCache(folder, 10**10))  # type: ignore[attr-defined]
    config = LoaderConfig.from_dict({**LOADER, "cache": cache}, batch_size=16)
    loader = build_dataloader(dataset, config, seed=0, drop_last=False)
    counts = count_requests(dataset)
    found = []
    for _ in range(epochs):
        before = counts.totals()["requests"] if counts else 0
        started = time.perf_counter()
        samples = sum(len(labels) for _, labels in loader)
        seconds = time.perf_counter() - started
        requests = (counts.totals()["requests"] - before) if counts else None
        found.append({"samples_per_s": round(samples / seconds, 1), "requests": requests})
    del loader
    return found


if __name__ == "__main__":
    main()
