"""What a search gains a user whose images are objects on S3, 30 and 80 ms away.

    python experiments/s3_search.py [--images 512] [--num-samples 8] [--shards 8]

The default dataset's JPEG files, one object each, and the same images as webdataset
tar shards (``--shards`` of them, experiments/to_shards.py's writer), in moto's S3 on
loopback behind the tests' proxy (tests/s3_for_tests.py): one proxy adds 30 ms to
each request's first byte, one 80 ms, both hold each request to 100 Mbit/s. The same
search, with the product's default windows (48 measured steps after 5 of warm-up),
runs on the local folder and on the local shards, then on the objects and on the
shards through each proxy, one after another in one run; each search measures its winner beside the
baselines in rotated verification rounds, and the ratios are those medians'
(``best_config.json``'s ``speedup``). Also recorded: the winner's requests in flight,
its limit (the least of the step on a resident batch, its input pipeline alone,
the store's top rate the profile measured, and what the two cores allow the step, the
workers and the test server sharing them, in samples/s, with the server's CPU a sample
measured in the run) and the winner against it,
the cost model's median error, the time to an answer against the same search on local
files (the shards' against their own search on the local shards, which runs too; also
against the local images' search), and the objects' small-objects finding (the rate
its profile projects for shards) beside the shards' measured rate.
Writes results/benchmarks/s3_search.json.

    python experiments/s3_search.py --throttle 0.01

runs the 30 ms search alone, with the short windows the other S3 experiments use
(``SEARCH``), with that share of GETs answered 503 SlowDown, and writes
whether it completed, the 503s its trials counted and its findings to
results/benchmarks/s3_search_throttled.json.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import save
from raytune_loader import load_best_config
from raytune_loader.candidates.structure import Structure
from raytune_loader.sources import synthetic
from to_shards import images_of, write_webdataset

BUCKET = "images"
TTFBS = (0.030, 0.080)
BYTES_PER_S = 100e6 / 8  # 100 Mbit/s a request
COMMON = ["--batch-size", "16", "--samples-per-trial", "256", "--verify-top", "1",
          "--verify-repeats", "3"]  # fmt: skip
# windows shorter than the product's, for the experiments that run many searches: 12
# steps after 2 of warm-up span less than a shard's GET on 4 workers' shards ahead
SHORT_WINDOWS = ["--steps", "12", "--warmup-steps", "2", "--report-every", "4"]
SEARCH = [*COMMON, *SHORT_WINDOWS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--throttle", type=float, default=0.0)
    parser.add_argument("--shards", type=int, default=8)
    args = parser.parse_args()
    if args.throttle:
        return _throttled(args)
    server = _server(TTFBS)
    with tempfile.TemporaryDirectory() as tmp, server as (moto, *proxies):
        root = synthetic.ensure_synthetic_imagenet(Path(tmp) / "data", args.images, 10, 2)
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1"}  # fmt: skip
        _upload(root / "train", moto)
        files, labels, _ = images_of(root / "train")
        shards = write_webdataset(files, labels, Path(tmp) / "shards", args.shards)
        _upload_shards(shards, moto)
        serving = {  # the server's CPU-seconds a sample read, as objects and as shards
            "objects": server_cost(server, proxies[0], "imagenet/", 1),
            "shards": server_cost(server, proxies[0], "shards/", args.images / args.shards),
        }
        pattern = f"s3://{BUCKET}/shards/shard-{{0000..{args.shards - 1:04d}}}.tar"
        # the product's own windows: a stream's shards ahead settle within them
        common = [*COMMON, "--num-samples", str(args.num_samples)]
        flags = [*common, "--dataset", "imagenet"]
        found = {"local": _search([*flags, "--data-root", str(root)], Path(tmp) / "local", env)}
        # the shards' own search on local files: what their searches on the bucket are to it
        on_disk = str(shards[0].parent / f"shard-{{0000..{args.shards - 1:04d}}}.tar")
        local_shards = [*common, "--dataset", "webdataset", "--data-root", on_disk]
        found["local-shards"] = _search(local_shards, Path(tmp) / "local-shards", env)
        for ttfb, proxy in zip(TTFBS, proxies, strict=True):
            remote = {**env, "AWS_ENDPOINT_URL": proxy}
            where = [*flags, "--data-root", f"s3://{BUCKET}/imagenet"]
            name = f"{int(ttfb * 1000)}ms"
            found[name] = _search(where, Path(tmp) / f"s3-{ttfb}", remote, serving["objects"])
            sharded = [*common, "--dataset", "webdataset", "--data-root", pattern]
            on_shards = _search(sharded, Path(tmp) / f"shards-{ttfb}", remote, serving["shards"])
            on_shards["vs_objects"] = round(
                on_shards["tuned_samples_per_s"] / found[name]["tuned_samples_per_s"], 3
            )
            on_shards["vs_local_shards"] = round(
                on_shards["tuned_samples_per_s"] / found["local-shards"]["tuned_samples_per_s"], 3
            )
            found[f"{name}-shards"] = on_shards
    for name, figures in found.items():  # against the same search on local files
        local = found["local-shards" if "shards" in name else "local"]["wall_time_s"]
        figures["time_vs_local"] = round(figures["wall_time_s"] / local, 3)
        figures["time_vs_local_images"] = round(
            figures["wall_time_s"] / found["local"]["wall_time_s"], 3
        )
    save("s3_search", {"images": args.images, "ttfb_s": list(TTFBS), "shards": args.shards,
                       "mbit_per_s_per_request": BYTES_PER_S * 8 / 1e6,
                       "server_cpu_s_per_sample": serving,
                       "flags": flags, "searches": found})  # fmt: skip


def server_cost(server: _server, proxy: str, prefix: str, samples_per_object: float) -> float:
    """The test server's CPU-seconds a sample read from it (moto and its proxy, its
    process's clock): what it takes of the two cores it shares with the trials (a real
    store's would be on its own machines). 8 threads each open a connection with one
    GET first, then GET every object under ``prefix`` through ``proxy``, read at least
    32 GETs, with the product's client."""
    from raytune_loader.stores.store import Store, StoreOptions
    from raytune_loader.stores.url import StoreUrl

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "testing")
    store = Store(StoreUrl("s3", BUCKET), StoreOptions(region="us-east-1", endpoint_url=proxy))
    keys = [key for key, _, _ in store.list() if key.startswith(prefix)]
    timed = keys * max(2, -(-32 // len(keys)))
    ready = threading.Barrier(8)

    def opened(key: str) -> None:  # one GET a thread: its connection, before the clock
        store.get(key)
        ready.wait()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(opened, keys[:1] * 8))
        served = server.cpu_s()
        list(pool.map(store.get, timed))
        return (server.cpu_s() - served) / (len(timed) * samples_per_object)


def _throttled(args: argparse.Namespace) -> None:
    """The 30 ms search with ``args.throttle`` of the GETs answered 503."""
    with tempfile.TemporaryDirectory() as tmp, _server([f"{TTFBS[0]}/{args.throttle}"]) as (
        moto, proxy,
    ):  # fmt: skip
        root = synthetic.ensure_synthetic_imagenet(Path(tmp) / "data", args.images, 10, 2)
        _upload(root / "train", moto)
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": proxy}  # fmt: skip
        flags = [*SEARCH, "--num-samples", str(args.num_samples), "--dataset", "imagenet",
                 "--data-root", f"s3://{BUCKET}/imagenet"]  # fmt: skip
        out = Path(tmp) / "out"
        figures = _search(flags, out, env)
        best = load_best_config(out / "imagenet" / "best_config.json").data
        with open(out / "imagenet" / "trials.csv") as handle:
            rows = list(csv.DictReader(handle))
    counted = sum(int(r["store_throttled"] or 0) for r in rows)
    save("s3_search_throttled", {
        "images": args.images, "ttfb_s": TTFBS[0], "throttle": args.throttle, "flags": flags,
        "completed": True, "trials_ok": sum(r["status"] == "ok" for r in rows),
        "trials": len(rows), "throttled_in_windows": counted,
        "findings": [f["kind"] for f in best.get("findings", [])],
        "throttled_finding": next((f["figure"] for f in best.get("findings", [])
                                   if f["kind"] == "throttled"), None),  # fmt: skip
        **figures,
    })  # fmt: skip


def _search(
    flags: list[str], out: Path, env: dict[str, str], serving: float = 0.0
) -> dict[str, Any]:
    """One search's figures, from its best_config.json and trials.csv; ``serving`` is the
    test server's CPU-seconds a sample read from it (:func:`server_cost`)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "raytune_loader.search", *flags, "--out",
                           str(out)], env=env, capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    dataset = flags[flags.index("--dataset") + 1]
    best = load_best_config(out / dataset / "best_config.json").data
    model, limit = best["search"].get("model", {}), best.get("limit") or {}
    profile = model.get("profile", {})
    tuned = best["metrics"]["samples_per_s"]["median"]
    store_samples = (profile.get("store_rate") or 0) / (profile.get("requests_per_sample") or 1)
    if best["pipeline"].get("cache"):  # a cached winner's window reads the disk, not the store
        store_samples = 0.0
    bounds = {
        "step": best["metrics"].get("ceiling_samples_per_s"),
        "input": limit.get("input_samples_per_s"),
        "store": store_samples or None,
        "cores": _cores_bound(best, serving, _worker_cpu(out / dataset / "trials.csv")),
    }
    known = {k: v for k, v in bounds.items() if v}
    small = next((f for f in best.get("findings", []) if f["kind"] == "small_objects"), None)
    figures = {
        "wall_time_s": round(time.perf_counter() - started, 1),
        "tuned_samples_per_s": best["metrics"]["samples_per_s"]["median"],
        "vs_heuristic": best["speedup"]["vs_heuristic"],
        "vs_pytorch_default": best["speedup"]["vs_pytorch_default"],
        "num_workers": best["loader"]["num_workers"],
        "fetch_threads": best["pipeline"]["fetch_threads"],
        "input_alone_samples_per_s": limit.get("input_samples_per_s"),
        "limit_bound": limit.get("bound"),
        "data_wait_frac": best["metrics"]["data_wait_frac"]["median"],
        "model_median_error": model.get("model_median_error"),
        "uncalibrated_median_error": model.get("uncalibrated_median_error"),
        "calibration": model.get("calibration"),
        "fetch_s": profile.get("fetch_s"),
        "requests_per_sample": profile.get("requests_per_sample"),
        "store": best["source"].get("store"),
        "limit_samples_per_s": bounds,
        "vs_limit": round(tuned / min(known.values()), 3) if known else None,
        "limited_by": min(known, key=known.__getitem__) if known else None,
        "small_objects_projected_samples_per_s": small["values"]["projected_samples_per_s"]
        if small
        else None,
        "findings": [f["kind"] for f in best.get("findings", [])],
        "trials": best["search"]["trials"],
    }
    print(out.name, figures, flush=True)
    return figures


def _cores_bound(
    best: dict[str, Any], serving: float = 0.0, seen: dict[str, float] | None = None
) -> float | None:
    """What the cores allow where the step, the workers and the test server share them
    (no GPU): the usable cores over the CPU-seconds a sample needs at the least. The
    step's (one thread, busy throughout the ceiling's windows: 1 / the ceiling), plus
    the cheapest structure: its worker side, the less of what the profile timed (1 /
    the samples/s one core made, with its collate where the timed side did not collate
    already: a stream batched in its workers did) and what a trial's worker processes
    were ``seen`` to spend (:func:`_worker_cpu`; the profile's is wall time on one core,
    and a search's own processes beside it made it 4-7% more than the trials' CPU
    time, so that a tuned loader beat the bound by 3%), and its finish, per sample;
    and for one that reads the store, not a warm cache, ``serving``: the test server's
    CPU-seconds a sample read from it (:func:`server_cost`; 0 for local files).
    Handing batches over, and a client's GETs where the profile's reading thread did
    not make them, only add to them, so no loader beats it; the step and the input
    alone, each with every core, are looser bounds here. None on a GPU or with several
    compute threads (threads that wait would count as busy)."""
    job, profile = best["job"], best["search"].get("model", {}).get("profile", {})
    ceiling = best["metrics"].get("ceiling_samples_per_s")
    read = profile.get("per_core", {})  # from the store: the server's share added
    warm = profile.get("cached_per_core", {})  # from a warm cache: none of the server's
    if job["device"] != "cpu" or job["compute_threads"] != 1 or not ceiling or not read:
        return None

    def cost(side: str, rate: float) -> float:
        collated = side.endswith("/stream/workers")  # inside the timed side already
        collate = 0.0 if collated else profile.get("collate_s", {}).get(side, 0.0)
        finish = profile.get("finish_s", {}).get(side, 0.0)
        made = 1 / rate + collate / profile["batch_size"]
        return min(made, (seen or {}).get(side, made)) + finish / profile["batch_size"]

    worker = min([cost(side, rate) + serving for side, rate in read.items()]
                 + [cost(side, rate) for side, rate in warm.items()])  # fmt: skip
    return float(profile["cores"] / (1 / ceiling + worker))


def _worker_cpu(trials: Path) -> dict[str, float]:
    """Each worker side's least CPU-seconds a sample (collating included) that a
    finished trial's worker processes spent in its window (``worker_cpu_s`` over its
    ``samples``; thread workers have no processes of their own to watch)."""
    seen: dict[str, float] = {}
    with trials.open() as handle:
        for row in csv.DictReader(handle):
            if row["status"] != "ok" or not row["worker_cpu_s"] or not row["samples"]:
                continue
            side = Structure(row["decode"], row["transfer"], row["workers"], row["access"],
                             row["batching"]).worker_side  # fmt: skip
            cost = float(row["worker_cpu_s"]) / float(row["samples"])
            seen[side] = min(cost, seen.get(side, cost))
    return seen


def _upload(folder: Path, endpoint: str) -> None:
    """The folder's files as ``imagenet/train/...`` objects (straight to moto)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")  # fmt: skip
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(folder.rglob("*.JPEG")):
        key = f"imagenet/train/{path.relative_to(folder).as_posix()}"
        client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())


def _upload_shards(shards: list[Path], endpoint: str) -> None:
    """The tar shards as ``shards/<name>`` objects (straight to moto)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")  # fmt: skip
    for path in shards:
        client.put_object(Bucket=BUCKET, Key=f"shards/{path.name}", Body=path.read_bytes())


class _server:  # noqa: N801 - a context manager, used as one
    """The S3 server in a process of its own: moto's URL, then one proxy's per entry of
    ``ttfbs`` (``0.03``, or ``0.03/0.01`` throttling 1% of GETs too)."""

    def __init__(self, ttfbs: Sequence[object]) -> None:
        self.ttfbs = ttfbs

    def __enter__(self) -> tuple[str, ...]:
        script = Path(__file__).resolve().parent.parent / "tests" / "s3_for_tests.py"
        ttfbs = ",".join(str(t) for t in (0, *self.ttfbs))
        self.process = subprocess.Popen([sys.executable, str(script), ttfbs, str(BYTES_PER_S)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)  # fmt: skip
        ports = self.process.stdout.readline().split()  # type: ignore[union-attr]
        return (f"http://127.0.0.1:{ports[0]}",
                *(f"http://127.0.0.1:{p}" for p in ports[2:]))  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        self.process.stdin.close()  # type: ignore[union-attr]
        self.process.wait(30)

    def cpu_s(self) -> float:
        """The CPU seconds the server (moto and its proxies, one process) has used."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
