"""Ray Data's actors on a bucket: a map call's objects fetched together, against one at a time.

    python experiments/s3_raydata.py [--images 256] [--rounds 3]

The default dataset's JPEG files, one object each, in moto's S3 on loopback behind the
tests' proxy (tests/s3_for_tests.py), 30 ms to each request's first byte and 100
Mbit/s a request. Two parts, in one run:

- **The pipeline alone.** One actor (a CPU), map calls of a training batch (16 rows),
  an epoch of the bucket read through Ray Data as a trial reads it, its actor fetching
  each call's objects together (``ACTOR_FETCHES`` in flight at most) or one at a time
  (as before); the two in rotated rounds, the ratio of their medians.
- **The search.** ``--ray-data`` on the bucket (s3_search.py's flags, 8 trials): the
  best verified Ray Data candidate, whether it was chosen, and its speed over the
  rule of thumb and over the best DataLoader; then the same on the images as
  ``--shards`` webdataset tar shards in the bucket, which Ray Data reads with Ray's
  own ``read_webdataset`` through Arrow's S3 client.

Writes results/benchmarks/s3_raydata.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from s3_search import BUCKET, BYTES_PER_S, SEARCH, _server, _upload, _upload_shards

from _common import save
from raytune_loader import load_best_config
from raytune_loader.sources import synthetic
from to_shards import images_of, write_webdataset

TTFB_S = 0.03


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--shards", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, _server((TTFB_S,)) as (moto, proxy):
        root = synthetic.ensure_synthetic_imagenet(Path(tmp) / "data", args.images, 10, 2)
        _upload(root / "train", moto)
        files, labels, _ = images_of(root / "train")
        _upload_shards(write_webdataset(files, labels, Path(tmp) / "shards", args.shards), moto)
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": proxy}  # fmt: skip
        os.environ.update(env)  # the actors' processes start in it
        pipeline = _pipeline(args.rounds)
        search = _search(args.num_samples, Path(tmp) / "out", "imagenet",
                         f"s3://{BUCKET}/imagenet")  # fmt: skip
        pattern = f"s3://{BUCKET}/shards/shard-{{0000..{args.shards - 1:04d}}}.tar"
        shards = _search(args.num_samples, Path(tmp) / "out-shards", "webdataset", pattern)
    save("s3_raydata", {"images": args.images, "ttfb_s": TTFB_S,
                        "mbit_per_s_per_request": BYTES_PER_S * 8 / 1e6, "shards": args.shards,
                        "pipeline": pipeline, "search": search,
                        "search_shards": shards})  # fmt: skip


def _pipeline(rounds: int) -> dict[str, Any]:
    """An epoch's samples/s through one actor, its calls' objects fetched together or one
    at a time, in rotated rounds."""
    import ray

    from raytune_loader import raydata
    from raytune_loader.candidates.rules import ACTOR_FETCHES
    from raytune_loader.raydata import dataset as ray_dataset
    from raytune_loader.raydata.config import RayDataConfig
    from raytune_loader.sources.datasets import DatasetSpec, build_dataset

    config = RayDataConfig(16, map_batch_size=16, crosses="uint8", decoder="tensor")
    dataset = build_dataset(DatasetSpec("imagenet", f"s3://{BUCKET}/imagenet"), "uint8", "tensor")
    rows = raydata.rows_of(dataset)
    rates: dict[str, list[float]] = {"together": [], "one_at_a_time": []}
    in_flight = {"together": ACTOR_FETCHES, "one_at_a_time": 1}
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for round_ in range(rounds):
            order = list(rates) if round_ % 2 == 0 else list(reversed(rates))
            for name in order:
                ray_dataset.ACTOR_FETCHES = in_flight[name]  # what the actors are handed
                loader = raydata.RayDataLoader(
                    raydata.build_dataset(rows, config, seed=round_), config
                )
                count, first = 0, None
                for _, labels in loader:  # from the first batch: the actor's start apart
                    if first is None:
                        first = time.perf_counter()
                        continue
                    count += len(labels)
                rates[name].append(count / (time.perf_counter() - (first or 0.0)))
                print(f"round {round_ + 1} {name}: {rates[name][-1]:.0f} samples/s", flush=True)
    finally:
        ray_dataset.ACTOR_FETCHES = ACTOR_FETCHES
        ray.shutdown()
    medians = {name: round(statistics.median(found), 1) for name, found in rates.items()}
    return {
        "actors": 1, "map_batch_size": 16, "in_flight": in_flight, "rounds": rounds,
        "samples_per_s": {name: [round(r, 1) for r in found] for name, found in rates.items()},
        "median_samples_per_s": medians,
        "together_over_one_at_a_time": round(medians["together"] / medians["one_at_a_time"], 2),
    }  # fmt: skip


def _search(num_samples: int, out: Path, dataset: str, root: str) -> dict[str, Any]:
    """The search with Ray Data candidates on the bucket: its best Ray Data candidate."""
    flags = [*SEARCH, "--num-samples", str(num_samples), "--dataset", dataset,
             "--data-root", root, "--ray-data", "--out", str(out)]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "raytune_loader.search", *flags],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    best = load_best_config(out / dataset / "best_config.json").data
    section = best.get("raydata") or {}
    metrics = section.get("metrics", {}).get("samples_per_s") or {}
    return {
        "flags": flags[:-2],
        "wall_time_s": round(time.perf_counter() - started, 1),
        "engine_chosen": best["engine"],
        "tuned_samples_per_s": best["metrics"]["samples_per_s"]["median"],
        "vs_heuristic": best["speedup"]["vs_heuristic"],
        "raydata_name": section.get("name"),
        "raydata_config": section.get("config"),
        "raydata_samples_per_s": metrics.get("median"),
        "raydata_vs_dataloader": section.get("speedup_vs_dataloader"),
        "trials": best["search"]["trials"],
    }


if __name__ == "__main__":
    main()
