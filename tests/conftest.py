"""Shared fixtures: a tiny real JPEG dataset and Ray hygiene; the tests side by side
(``alone``'s hooks)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from alone import (  # noqa: F401 - pytest finds hooks by name in a conftest
    TAG,
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_protocol,
    pytest_unconfigure,
    pytest_xdist_make_scheduler,
)
from raytune_loader.sources.synthetic import ensure_synthetic_imagenet

TESTS = Path(__file__).parent
REPO = TESTS.parent
SLOW_TIMEOUT_S = 900  # a slow test's limit: its real searches take up to three minutes


def pytest_itemcollected(item: pytest.Item) -> None:
    """A slow test gets the slow tier's time limit, unless it is marked with its own."""
    if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
        item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


@pytest.fixture(scope="session")
def tiny_imagenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """96 real JPEG files in the synthetic-imagenet layout (<root>/train/<class>/...)."""
    root = tmp_path_factory.mktemp("data") / "synthetic"
    return ensure_synthetic_imagenet(root, num_images=96, num_classes=8, processes=2)


def ray_processes() -> set[int]:
    """PIDs of the Ray daemons (raylet, gcs_server, dashboard) this test process's tests
    started: those carrying its tag, not a neighbouring worker's search's."""
    out = subprocess.run(
        ["pgrep", "-u", str(os.getuid()), "-f", "raylet|gcs_server|dashboard/dashboard.py"],
        capture_output=True,
        text=True,
    )
    ours = set()
    for pid in map(int, out.stdout.split()):
        try:
            if psutil.Process(pid).environ().get(TAG) == os.environ[TAG]:
                ours.add(pid)
        except psutil.Error:
            continue  # ended meanwhile
    return ours


def ray_processes_left(before: set[int], timeout: float = 20) -> set[int]:
    """This test process's Ray daemons not in ``before``, once they had ``timeout`` s to
    end (a daemon told to stop may take seconds on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while (left := ray_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def run_cli(*args: str, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None):
    """The real command line in a subprocess, with tests/ importable for module:function."""
    full_env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "raytune_loader.search", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


TINY_SEARCH = (
    "--dataset", "synthetic-imagenet", "--synthetic-images", "96",
    "--batch-size", "8", "--steps", "6", "--warmup-steps", "1", "--report-every", "3",
    "--samples-per-trial", "64", "--verify-top", "1", "--verify-repeats", "2",
    "--precision", "tf32",  # not the default, so it must reach the JSON; a CPU without
    # bf16 instructions emulates bf16 (a small-cnn step 10x slower than in fp32)
)  # fmt: skip


class Said:
    """A Progress that keeps its warnings (stages and counts pass)."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def stage(self, text: str) -> None: ...

    def count(self, what: str, done: int, total: int) -> None: ...

    def trial(self, event: object) -> None: ...

    def warn(self, text: str) -> None:
        self.warnings.append(text)


class OneNode:
    """A one-node cluster of 2 CPUs, no CPU node beyond the trials' (RayCluster's face)."""

    remote_cpus, node_cpus = 0.0, 2.0


@dataclass(frozen=True)
class Searched:
    """One real search, run once per test session and read by many tests."""

    result: subprocess.CompletedProcess[str]
    folder: Path  # results/synthetic-imagenet
    ray_before: set[int]  # Ray daemons that ran before it
    ray_sessions: tuple[Path, ...]  # its Ray instance's session folders


# the credentials in the session search's environment, as a user with data on S3 has
# them: none may reach a file the search or its Ray instance writes
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "AKIASEARCHDONOTWRITE",
    "AWS_SECRET_ACCESS_KEY": "search-secret-do-not-write",
    "AWS_SESSION_TOKEN": "search-token-do-not-write",
}


def ray_sessions(root: str | None = None) -> set[Path]:
    """Ray's session folders under ``root`` (a ``RAY_TMPDIR``), or where Ray puts them on
    Linux by default."""
    root = root or os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return set(Path(root, "ray").glob("session_2*"))


@pytest.fixture(scope="session")
def searched(tiny_imagenet: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Searched]:
    """``python -m raytune_loader.search`` end to end: 4 trials on 96 real JPEG files,
    its Ray instance's files in a folder of its own (short: Ray's socket paths must be)."""
    import tempfile

    tmp = tmp_path_factory.mktemp("search")
    ray_tmp = tempfile.mkdtemp(prefix="rtl-", dir="/tmp")
    before = ray_processes()
    try:
        result = run_cli(
            *TINY_SEARCH, "--data-root", str(tiny_imagenet), "--num-samples", "4",
            "--out", str(tmp / "results"), cwd=tmp, env={**CREDENTIALS, "RAY_TMPDIR": ray_tmp},
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        sessions = tuple(sorted(ray_sessions(ray_tmp)))
        yield Searched(result, tmp / "results" / "synthetic-imagenet", before, sessions)
    finally:  # a failed search's Ray files too
        shutil.rmtree(ray_tmp, ignore_errors=True)


def write_shards(images: Path, out: Path, shards: int) -> list[Path]:
    """The ImageFolder ``images`` as webdataset tar shards (``jpg`` and ``cls`` per
    sample), round-robin over ``shards`` files, in a stable order."""
    import contextlib
    import io
    import tarfile

    classes = sorted(p.name for p in images.iterdir() if p.is_dir())
    files = sorted(images.rglob("*.JPEG"))
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"shard-{i:04d}.tar" for i in range(shards)]
    with contextlib.ExitStack() as stack:
        tars = [stack.enter_context(tarfile.open(path, "w")) for path in paths]
        for index, file in enumerate(files):
            members = {"jpg": file.read_bytes(),
                       "cls": str(classes.index(file.parent.name)).encode()}  # fmt: skip
            for ext, data in members.items():
                info = tarfile.TarInfo(f"sample{index:06d}.{ext}")
                info.size = len(data)
                tars[index % shards].addfile(info, io.BytesIO(data))
    return paths


@pytest.fixture(scope="session")
def tiny_shards(tiny_imagenet: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_imagenet's 96 JPEG files as 4 webdataset shards of 24 samples."""
    folder = tmp_path_factory.mktemp("shards")
    write_shards(tiny_imagenet / "train", folder, 4)
    return folder


UNEVEN = (20, 20, 4)  # samples per shard: shard sets end unevenly


def write_uneven_shards(images: Path, out: Path, sizes: tuple[int, ...] = UNEVEN) -> Path:
    """The first ``sum(sizes)`` JPEG files of ``images`` as webdataset shards (``wds/``)
    and Parquet files (``parquet/``) of ``sizes`` samples, each sample's class its index
    in that order: what a rank read is in its batches' labels."""
    import io
    import tarfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(images.rglob("*.JPEG"))[: sum(sizes)]
    for kind in ("wds", "parquet"):
        (out / kind).mkdir(parents=True, exist_ok=True)
    start = 0
    for shard, size in enumerate(sizes):
        part = list(enumerate(files[start : start + size], start))
        with tarfile.open(out / "wds" / f"shard-{shard:04d}.tar", "w") as tar:
            for index, file in part:
                for ext, data in (("jpg", file.read_bytes()), ("cls", str(index).encode())):
                    info = tarfile.TarInfo(f"s{index:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        rows = {"image": [{"bytes": f.read_bytes(), "path": f.name} for _, f in part],
                "label": [index for index, _ in part]}  # fmt: skip
        pq.write_table(pa.table(rows), out / "parquet" / f"part-{shard}.parquet")
        start += size
    return out


@pytest.fixture(scope="session")
def uneven_shards(tiny_imagenet: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """44 of tiny_imagenet's JPEG files in shards of 20, 20 and 4 samples, as webdataset
    tar shards (``wds/``) and Parquet files (``parquet/``); a sample's class is its index."""
    return write_uneven_shards(tiny_imagenet / "train", tmp_path_factory.mktemp("uneven"))


class _Unformed:
    """What a rank puts on ``results`` when its gloo group did not form."""

    def __init__(self, why: str) -> None:
        self.why = why


@contextlib.contextmanager
def gloo_group(rank: int, store: str, results: object) -> Iterator[None]:
    """A two-rank gloo group for a :func:`two_gloo_ranks` target, destroyed on leaving.
    Where it does not form (``Gloo connectFullMesh failed ... Connection closed by peer``
    under load), the rank says so on ``results`` and exits, and the ranks meet again, as
    the product's rank runner does. Both ranks pass a barrier first: a rank whose peer
    failed to join reads nothing (the store tests count every GET)."""
    import datetime as dt

    import torch.distributed as dist

    from raytune_loader.errors import last_line

    try:
        dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2,
                                timeout=dt.timedelta(seconds=180))  # fmt: skip
        dist.barrier()  # init has none: one rank may be out while its peer failed
    except (RuntimeError, ValueError) as exc:  # a peer's connection, the meeting's file
        results.put((rank, _Unformed(last_line(exc))))  # type: ignore[attr-defined]
        raise SystemExit(3) from exc
    try:
        yield
    finally:
        dist.destroy_process_group()


def _from_ranks(ranks: list, results: object, timeout: float) -> list[tuple[int, object]]:
    """Each rank's ``(rank, what it read)``; a rank that exits without putting its result
    fails the test at once with its exit code, not after ``timeout``. A rank whose group
    did not form ends the wait at once."""
    import queue

    got: list[tuple[int, object]] = []
    deadline = time.monotonic() + timeout
    exited: dict[int, float] = {}  # a rank without a result: when it was seen gone
    while len(got) < len(ranks):
        try:
            got.append(results.get(timeout=1))  # type: ignore[attr-defined]
            if isinstance(got[-1][1], _Unformed):
                return got
            continue
        except queue.Empty:
            pass
        reported = {rank for rank, _ in got}
        for rank, process in enumerate(ranks):
            if rank not in reported and process.exitcode is not None:
                exited.setdefault(rank, time.monotonic())
        # a result may still be in the pipe for a moment after its rank exits
        dead = [r for r, when in exited.items() if time.monotonic() - when > 5]
        if dead or time.monotonic() > deadline:
            what = (f"rank {dead[0]} exited with {ranks[dead[0]].exitcode} and no result"
                    if dead else f"no result in {timeout:.0f} s")  # fmt: skip
            raise AssertionError(f"{what}; the ranks' output above says why")
    return got


def two_gloo_ranks(target: object, *args: object, timeout: float = 240) -> dict[int, object]:
    """``target(rank, store, *args, results)`` in two spawned processes, ranks of a gloo
    group they make with :func:`gloo_group`; each puts ``(rank, what it read)`` on
    ``results``. The group meets in a file, not on a port: a free port picked here can be
    taken by another test's Ray before rank 0 binds it. A group that did not form is
    formed again in a new meeting file, as often as the product's rank runner does it
    (:data:`raytune_loader.measuring.ranks.GROUP_TRIES`)."""
    from raytune_loader.measuring.ranks import GROUP_TRIES

    for _ in range(GROUP_TRIES):
        got = _ranks_once(target, args, timeout)
        unformed = [why for why in got.values() if isinstance(why, _Unformed)]
        if not unformed:
            return got
    raise AssertionError(f"the gloo group did not form {GROUP_TRIES} times: {unformed[0].why}")


def _ranks_once(target: object, args: tuple[object, ...], timeout: float) -> dict[int, object]:
    import multiprocessing
    import tempfile

    context = multiprocessing.get_context("spawn")
    folder = tempfile.mkdtemp(prefix="gloo-")
    store = f"file://{folder}/store"
    results = context.Queue()
    ranks = [context.Process(target=target, args=(r, store, *args, results)) for r in (0, 1)]
    got: dict[int, object] = {}
    try:
        for process in ranks:
            process.start()
        got = dict(_from_ranks(ranks, results, timeout))
        return got
    finally:  # a rank that died, or did not join, leaves its peer waiting in the group
        wait = 0 if any(isinstance(v, _Unformed) for v in got.values()) else 30
        for process in (p for p in ranks if p.pid is not None):  # started
            process.join(timeout=wait)
            if process.is_alive():
                process.kill()
                process.join()
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Tables:
    saved: Path  # save_to_disk: a DatasetDict whose train split is 3 Arrow files
    parquet: Path  # the same rows as 3 Parquet files
    samples: Counter[tuple[bytes, int]]  # every (JPEG file's bytes, class)
    classes: list[str]


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """HF's datasets, offline, its Arrow cache (the Parquet files converted) in a
    temporary folder rather than the user's."""
    from raytune_loader.sources import hf_tables

    hf = hf_tables._datasets()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hf.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield hf


@pytest.fixture(scope="session")
def tables(
    tiny_imagenet: Path, hf_cache: object, tmp_path_factory: pytest.TempPathFactory
) -> Tables:
    """tiny_imagenet's 96 JPEG files as an HF table (Image bytes with their file names,
    ClassLabel), written both ways."""
    hf = hf_cache
    images = tiny_imagenet / "train"
    classes = sorted(p.name for p in images.iterdir() if p.is_dir())
    files = sorted(images.rglob("*.JPEG"))
    labels = [classes.index(f.parent.name) for f in files]
    rows = hf.Dataset.from_dict(  # type: ignore[attr-defined]
        {"image": [{"bytes": f.read_bytes(), "path": f.name} for f in files], "label": labels},
        features=hf.Features(image=hf.Image(), label=hf.ClassLabel(names=classes)),  # type: ignore[attr-defined]
    )
    folder = tmp_path_factory.mktemp("hf")
    from raytune_loader.sources import hf_tables

    with hf_tables._quiet(hf):
        hf.DatasetDict(train=rows).save_to_disk(folder / "saved", num_shards={"train": 3})  # type: ignore[attr-defined]
        for i in range(3):
            rows.shard(3, i, contiguous=True).to_parquet(folder / "parquet" / f"part-{i}.parquet")
    samples = Counter((f.read_bytes(), label) for f, label in zip(files, labels, strict=True))
    return Tables(folder / "saved", folder / "parquet", samples, classes)
