"""What a GET costs the client's cores, against what a sample costs them in all.

    python experiments/s3_client_cost.py [--images 512] [--shards 8]

The setting of ``experiments/s3_search.py``: the default dataset's JPEG files as single
objects and as webdataset tar shards, in moto's S3 behind the tests' proxy 30 ms and
100 Mbit/s a request away. The product's client (:class:`~raytune_loader.stores.store.Store`)
GETs every shard four times, 4 threads at once (as a stream's shards read ahead),
and 128 objects, 8 threads at once, each thread's connection opened first. Recorded
per GET and per sample: this process's CPU-seconds (the client alone: the server is a
process of its own), the reading threads' own CPU, the part the GET's clock
(:func:`~raytune_loader.stores.store.thread_gets`) sees, and the server's CPU.

Against ``s3_search.json``'s cores bound for the shards 30 ms away (the two cores over
the CPU-seconds a sample takes the step, the cheapest worker side and the server, the
client's GETs on fetch threads left out): the share of a sample's CPU the fetch
threads' GETs add. Writes results/benchmarks/s3_client_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from s3_search import BUCKET, BYTES_PER_S, TTFBS, _server, _upload, _upload_shards

from _common import RESULTS, save
from raytune_loader.sources import synthetic
from to_shards import images_of, write_webdataset

ROUNDS = {"shards": (4, 4), "objects": (8, 128)}  # threads, and GETs (shards: rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--shards", type=int, default=8)
    args = parser.parse_args()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "testing")
    server = _server(TTFBS[:1])
    with tempfile.TemporaryDirectory() as tmp, server as (moto, proxy):
        root = synthetic.ensure_synthetic_imagenet(Path(tmp) / "data", args.images, 10, 2)
        _upload(root / "train", moto)
        files, labels, _ = images_of(root / "train")
        shards = write_webdataset(files, labels, Path(tmp) / "shards", args.shards)
        _upload_shards(shards, moto)
        per_shard = args.images / args.shards
        found = {
            "shards": _costs(server, proxy, "shards/", per_shard, *ROUNDS["shards"]),
            "objects": _costs(server, proxy, "imagenet/", 1.0, *ROUNDS["objects"]),
        }
    search = json.loads((RESULTS / "s3_search.json").read_text())
    cores_bound = search["searches"]["30ms-shards"]["limit_samples_per_s"]["cores"]
    # the bound's CPU-seconds a sample, on the cores that run measured
    sample_cpu_s = search["machine"]["usable_cpus"] / cores_bound
    client = found["shards"]["client_cpu_s_per_sample"]
    save("s3_client_cost", {
        "images": args.images, "shards": args.shards, "ttfb_s": TTFBS[0],
        "mbit_per_s_per_request": BYTES_PER_S * 8 / 1e6, "gets": found,
        "s3_search_30ms_shards_cores_bound": round(cores_bound, 1),
        "s3_search_30ms_shards_cpu_s_per_sample": round(sample_cpu_s, 6),
        "shards_client_share_of_a_sample": round(client / sample_cpu_s, 4),
    })  # fmt: skip


def _costs(
    server: _server, proxy: str, prefix: str, samples_per_object: float, threads: int, gets: int
) -> dict[str, Any]:
    """The client's and the server's CPU a GET of the objects under ``prefix``, ``threads``
    at once: every one ``gets`` times for shards, else the first ``gets``."""
    from raytune_loader.stores.store import Store, StoreOptions, thread_gets
    from raytune_loader.stores.url import StoreUrl

    store = Store(StoreUrl("s3", BUCKET), StoreOptions(region="us-east-1", endpoint_url=proxy))
    keys = [key for key, _, _ in store.list() if key.startswith(prefix)]
    timed = keys * gets if prefix == "shards/" else keys[:gets]
    ready = threading.Barrier(threads)

    def opened(key: str) -> None:  # each thread's connection, before the clocks
        store.get(key)
        ready.wait()

    def got(key: str) -> tuple[float, float, int]:
        cpu_s, (_, clock_s) = time.thread_time(), thread_gets()
        size = len(store.get(key))
        return time.thread_time() - cpu_s, thread_gets()[1] - clock_s, size

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(opened, keys[:1] * threads))
        process_s, wall_s, served_s = time.process_time(), time.perf_counter(), server.cpu_s()
        costs = list(pool.map(got, timed))
        process_s = time.process_time() - process_s
        wall_s, served_s = time.perf_counter() - wall_s, server.cpu_s() - served_s
    n = len(timed)
    client = process_s / n
    return {
        "gets": n, "threads": threads, "samples_per_get": samples_per_object,
        "bytes_per_get": round(sum(size for _, _, size in costs) / n),
        "wall_s": round(wall_s, 2),
        "client_cpu_s_per_get": round(client, 5),
        "thread_cpu_s_per_get": round(sum(cpu for cpu, _, _ in costs) / n, 5),
        "get_clock_cpu_s_per_get": round(sum(clock for _, clock, _ in costs) / n, 5),
        "server_cpu_s_per_get": round(served_s / n, 5),
        "client_cpu_s_per_sample": round(client / samples_per_object, 7),
    }  # fmt: skip


if __name__ == "__main__":
    main()
