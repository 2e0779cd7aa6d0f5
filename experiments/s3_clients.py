"""Which object store client to read with: each one's cost per request and its
throughput at concurrency, against the same S3 server.

    python experiments/s3_clients.py [--objects 256] [--rounds 3]

The server is moto's S3 on loopback behind the tests' proxy (tests/s3_for_tests.py),
holding the default dataset's JPEG files as single objects. For each client (the
package's own GET: botocore's signer over urllib3; obstore, boto3, s3fs,
s3torchconnector's CRT client), in rotated rounds:

- **per core**: GETs one after another with no added latency; the client's CPU time
  per request (the process's, the server's threads apart as far as a shared process
  allows) and the requests per CPU-second it implies;
- **at concurrency**: 1, 8 and 32 threads each issuing GETs, the proxy adding 30 ms to
  first byte and holding each request to 100 Mbit/s; requests per second and the CPU
  they cost.

Also measured, once each: whether a GET completes in a forked child after the parent
used the client (a DataLoader worker's start), and how many GETs one call sends into a
store that throttles every GET (retries the caller cannot count). Also measured: the
server's own top rate (the fastest client at 32 threads with no added
latency), which bounds every figure on two shared cores. Writes
results/benchmarks/s3_clients.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the server


from _common import save
from raytune_loader.sources import synthetic
from raytune_loader.verdict.selection import rotated

BUCKET = "images"
CONCURRENCY = (1, 8, 32)
TTFB_S = 0.030
BYTES_PER_S = 100e6 / 8  # 100 Mbit/s a request


def clients(endpoint: str) -> dict[str, Callable[[], Callable[[str], bytes]]]:
    """Each client as a factory of a ``get(key) -> bytes`` that threads may share."""

    def signed_get() -> Callable[[str], bytes]:
        from raytune_loader.stores.store import Store, StoreOptions
        from raytune_loader.stores.url import StoreUrl

        return Store(StoreUrl("s3", BUCKET), StoreOptions(endpoint_url=endpoint)).get

    def obstore_get() -> Callable[[str], bytes]:
        import obstore
        from obstore.store import S3Store

        store = S3Store(BUCKET, endpoint=endpoint, client_options={"allow_http": True})
        return lambda key: bytes(obstore.get(store, key).bytes())

    def boto3_get() -> Callable[[str], bytes]:
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=endpoint,
                              config=Config(max_pool_connections=64))  # fmt: skip
        return lambda key: client.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    def s3fs_get() -> Callable[[str], bytes]:
        import s3fs

        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
        return lambda key: fs.cat(f"{BUCKET}/{key}")

    def crt_get() -> Callable[[str], bytes]:
        from s3torchconnector._s3client import S3Client, S3ClientConfig

        client = S3Client("us-east-1", endpoint=endpoint,
                          s3client_config=S3ClientConfig(force_path_style=True))  # fmt: skip
        return lambda key: client.get_object(BUCKET, key).read()

    return {"raytune_loader": signed_get, "obstore": obstore_get, "boto3": boto3_get,
            "s3fs": s3fs_get, "s3torchconnector": crt_get}  # fmt: skip


def survives_fork(get: Callable[[str], bytes], key: str, wait_s: float = 20.0) -> bool:
    """Whether a GET completes in a forked child (a DataLoader worker's start) after
    this process used the same client."""
    get(key)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 once its GET is answered
        try:
            get(key)
        finally:
            os._exit(0)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.05)
    os.kill(pid, 9)  # hung: the client's runtime did not survive the fork
    os.waitpid(pid, 0)
    return False


def per_core(get: Callable[[str], bytes], keys: list[str]) -> dict[str, float]:
    """GETs one after another: wall and CPU seconds per request."""
    for key in keys[:8]:  # connections opened, code paths warm
        get(key)
    wall, cpu = time.perf_counter(), time.process_time()
    for key in keys:
        get(key)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall_ms_per_request": 1000 * wall / len(keys),
            "cpu_ms_per_request": 1000 * cpu / len(keys),
            "requests_per_cpu_s": len(keys) / cpu if cpu else 0.0}  # fmt: skip


def concurrent(get: Callable[[str], bytes], keys: list[str], threads: int) -> dict[str, float]:
    """``threads`` threads each issuing GETs over ``keys``: requests/s and CPU a request."""
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(get, keys[: max(threads, 8)]))  # warm: a connection a thread
        wall, cpu = time.perf_counter(), time.process_time()
        total = sum(len(b) for b in pool.map(get, keys))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"requests_per_s": len(keys) / wall, "mbit_per_s": 8 * total / wall / 1e6,
            "cpu_ms_per_request": 1000 * cpu / len(keys)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    for inner in ("--property", "--endpoint", "--throttled", "--key"):  # _properties' own
        parser.add_argument(inner, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.property:
        return _property(args.property, args.endpoint, args.throttled, args.key)
    with tempfile.TemporaryDirectory() as tmp, _server() as (moto, plain, slow):
        root = synthetic.ensure_synthetic_imagenet(Path(tmp) / "d", args.objects, 10, 2)
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1"}  # fmt: skip
        os.environ.update(env)  # the credentials; each client is given its endpoint
        keys = _upload(root / "train", moto)
        sizes = [os.path.getsize(p) for p in (root / "train").rglob("*.JPEG")]
        properties = _properties(moto, plain, keys[0])
        made = {kind: {name: make() for name, make in clients(endpoint).items()}
                for endpoint, kind in ((plain, "plain"), (slow, "slow"))}  # fmt: skip
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in made["plain"]}
        for repeat, name in rotated(list(runs), args.rounds):
            found = {f"per_core_{k}": v for k, v in per_core(made["plain"][name], keys).items()}
            for threads in CONCURRENCY:
                got = concurrent(made["slow"][name], keys, threads)
                found |= {f"at_{threads}_{k}": v for k, v in got.items()}
            runs[name].append(found)
            print(f"round {repeat + 1} {name}: {found}", flush=True)
        medians = {name: {k: round(statistics.median(r[k] for r in found), 3)
                          for k in found[0]} for name, found in runs.items()}  # fmt: skip
        best = max(medians, key=lambda n: medians[n]["per_core_requests_per_cpu_s"])
        server = concurrent(made["plain"][best], keys, 32)
    save("s3_clients", {
        "objects": len(keys), "mean_object_bytes": round(statistics.mean(sizes)),
        "ttfb_s": TTFB_S, "mbit_per_s_per_request": BYTES_PER_S * 8 / 1e6,
        "versions": _versions(), "properties": properties, "medians": medians, "runs": runs,
        "server_top_rate": {"client": best, **{k: round(v, 3) for k, v in server.items()}},
    })  # fmt: skip


def _properties(moto: str, plain: str, key: str) -> dict[str, dict[str, object]]:
    """Each client's survival of a fork, and the GETs one call sends into a store that
    throttles every GET (a proxy of this process's, in front of the same server). Each
    client is tried in a process of its own: a runtime a fork breaks stays there."""
    from s3_for_tests import SlowProxy

    proxy = SlowProxy(int(moto.rsplit(":", 1)[1]), throttle=1.0).start()
    try:
        found: dict[str, dict[str, object]] = {}
        for name in clients(plain):
            command = [sys.executable, __file__, "--property", name, "--endpoint", plain,
                       "--throttled", f"http://127.0.0.1:{proxy.port}", "--key", key]  # fmt: skip
            before = proxy.gets
            try:
                out = subprocess.run(command, capture_output=True, text=True, timeout=120)
                forked: object = out.stdout.strip().splitlines()[-1] == "survives"
            except (subprocess.TimeoutExpired, IndexError):
                forked = "no answer"
            found[name] = {"survives_fork": forked, "gets_per_throttled_call": proxy.gets - before}
            print(f"{name}: {found[name]}", flush=True)
        return found
    finally:
        proxy.stop()


def _property(name: str, endpoint: str, throttled: str, key: str) -> None:
    """In a process of its own: one throttled call, then the fork check (printed)."""
    with contextlib.suppress(Exception):
        clients(throttled)[name]()(key)
    print("survives" if survives_fork(clients(endpoint)[name](), key) else "hangs", flush=True)


@contextlib.contextmanager
def _server():  # noqa: ANN202 - (moto's, the plain proxy's, the slow proxy's URLs)
    """The S3 server in a process of its own: the clients' CPU time is theirs alone."""
    script = Path(__file__).resolve().parent.parent / "tests" / "s3_for_tests.py"
    command = [sys.executable, str(script), f"0,{TTFB_S}", str(BYTES_PER_S)]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ports = process.stdout.readline().split()  # type: ignore[union-attr]
        yield tuple(f"http://127.0.0.1:{p}" for p in ports)
    finally:
        process.stdin.close()  # type: ignore[union-attr]
        process.wait(30)


def _upload(folder: Path, endpoint: str) -> list[str]:
    """The folder's files as the bucket's objects (straight to moto: no delay)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    keys = []
    for path in sorted(folder.rglob("*.JPEG")):
        key = path.relative_to(folder).as_posix()
        client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
        keys.append(key)
    return keys


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("obstore", "boto3", "s3fs", "s3torchconnector", "moto")}


if __name__ == "__main__":
    main()
