"""Where a search on S3 spends the time that the same search on local files does not.

    python experiments/s3_time_split.py [--ttfb 0.03] [--images 512] [--rounds 2]
    python experiments/s3_time_split.py --shards 8 --windows default --rounds 1
    python experiments/s3_time_split.py --ttfb 0.08 --windows default --rounds 2

Runs s3_search.py's search (its flags, the default dataset's JPEG files as single
objects in moto's S3 behind the tests' proxy, ``--ttfb`` to the first byte and
100 Mbit/s a request) on the bucket, then on the local folder, and times each
search's phases by its progress lines as they arrive: start-up and the ceiling, the
profile, the trials (each named with its samples/s), verification, the input
pipeline alone and the probes. Writes results/benchmarks/s3_time_split.json: each
phase's seconds on the bucket and locally, and their ratio, for the time-to-answer
target (the search on a bucket at most 1.5x the local one's time): with s3_search.py's
short windows (the fewest batches a steady window has), and with the windows the
product's defaults measure, as a user's search runs them. Each pair runs ``--rounds``
times, rotated (the bucket first, then local first), and the ratio is the rounds'
median. With ``--shards N`` the images are N webdataset shards instead, searched in
the bucket and on local disk (results/benchmarks/s3_time_split_shards.json); a
``--ttfb`` other than 30 ms adds it to the file's name (s3_time_split_80ms.json);
``--windows`` runs one kind of windows alone.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from s3_search import BUCKET, SEARCH, _server, _upload, _upload_shards

from _common import save
from raytune_loader.sources import synthetic
from to_shards import images_of, write_webdataset

# a phase starts at the first progress line that matches its pattern
PHASES = (
    ("start_and_ceiling", r""),
    ("profile", r"==> Profiling"),
    ("trials", r"==> Searching"),
    ("verification", r"verifying \(each configuration"),
    ("input_alone", r"measuring the input pipeline alone"),
    ("probes", r"probing the tuned loader"),
    ("report", r"^\s*config\s+workers"),
)
DEFAULT_TTFB = 0.03  # another --ttfb names its file: s3_time_split_80ms.json
TRIAL = re.compile(r"\[(\d+)/\d+\] (done|stopped early|failed): (.*?) (\d+) samples/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ttfb", type=float, default=DEFAULT_TTFB)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shards", type=int, default=0, help="webdataset shards (0: objects)")
    parser.add_argument("--windows", choices=("short", "default"), default=None)
    args = parser.parse_args()
    server = _server((args.ttfb,))
    with tempfile.TemporaryDirectory() as tmp, server as (moto, proxy):
        root = synthetic.ensure_synthetic_imagenet(Path(tmp) / "data", args.images, 10, 2)
        _upload(root / "train", moto)  # the bucket, made there
        if args.shards:
            files, labels, _ = images_of(root / "train")
            shards = write_webdataset(files, labels, Path(tmp) / "shards", args.shards)
            _upload_shards(shards, moto)
            names = f"shard-{{0000..{args.shards - 1:04d}}}.tar"
            local = str(Path(tmp) / "shards" / names)
            roots = {"s3": f"s3://{BUCKET}/shards/{names}", "local": local}
        else:
            roots = {"s3": f"s3://{BUCKET}/imagenet", "local": str(root)}
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": proxy}  # fmt: skip
        windows = {}
        for window, flags in _windows(args.shards).items():
            if args.windows not in (None, window):
                continue
            rounds = []
            for round_ in range(args.rounds):  # rotated: the bucket first, then local first
                found = {}
                for where in ("s3", "local") if round_ % 2 == 0 else ("local", "s3"):
                    out = Path(tmp) / f"{where}-{window}-{round_}"
                    found[where] = _one(where, flags, roots[where], out, env, server)
                total = round(found["s3"]["wall_time_s"] / found["local"]["wall_time_s"], 3)
                rounds.append({"searches": found, "s3_over_local": _ratios(found),
                               "time_vs_local": total})  # fmt: skip
            median = round(statistics.median(r["time_vs_local"] for r in rounds), 3)
            windows[window] = {"flags": flags, "rounds": rounds, "time_vs_local": median}
    name = "s3_time_split_shards" if args.shards else "s3_time_split"
    name += "" if args.ttfb == DEFAULT_TTFB else f"_{round(args.ttfb * 1000)}ms"
    save(name, {"ttfb_s": args.ttfb, "images": args.images, "shards": args.shards,
                "rounds": args.rounds, "windows": windows})  # fmt: skip


def _one(
    where: str, flags: list[str], root: str, out: Path, env: dict[str, str], server: Any
) -> dict[str, Any]:
    """One search of ``root``, on the bucket (with the test server's CPU in it: on two
    cores it is the search's to share, where a real store costs the node none) or on
    local files."""
    if where == "local":
        return _timed([*flags, "--data-root", root], out, env)
    served = server.cpu_s()
    found = _timed([*flags, "--data-root", root], out, env)
    found["server_cpu_s"] = round(server.cpu_s() - served, 1)
    return found


def _ratios(found: dict[str, Any]) -> dict[str, float]:
    """Each phase's seconds on the bucket over its seconds on local files."""
    return {
        phase: round(found["s3"]["phases_s"][phase] / found["local"]["phases_s"][phase], 2)
        for phase in found["s3"]["phases_s"]
        if found["local"]["phases_s"].get(phase)
    }


def _windows(shards: int = 0) -> dict[str, list[str]]:
    """The searches' flags: s3_search.py's short windows (12 steps after 2 of warm-up,
    256 samples a trial: too few for the halves to be compared), and the windows the
    product's defaults measure (48 steps after 5 of warm-up), as a user's search runs
    them."""
    common = ["--num-samples", "8", "--dataset", "webdataset" if shards else "imagenet"]
    window = {"--steps", "--warmup-steps", "--report-every", "--samples-per-trial"}
    pairs = list(zip(SEARCH[::2], SEARCH[1::2], strict=True))
    product = [x for flag, value in pairs if flag not in window for x in (flag, value)]
    return {"short": [*SEARCH, *common], "default": [*product, *common]}


def _timed(flags: list[str], out: Path, env: dict[str, str]) -> dict[str, Any]:
    """One search's wall time, its phases' seconds, and each trial's seconds and rate."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "raytune_loader.search", *flags, "--out", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    marks: dict[str, float] = {"start_and_ceiling": 0.0}
    trials, last = [], None
    for line in process.stdout:  # type: ignore[union-attr]
        now = time.perf_counter() - started
        for phase, pattern in PHASES[1:]:
            if phase not in marks and re.search(pattern, line):
                marks[phase] = now
        hit = TRIAL.search(line)
        if hit:
            since = marks.get("trials", 0.0) if last is None else last
            seconds = round(now - since, 1)
            trials.append({"trial": int(hit[1]), "status": hit[2], "config": hit[3],
                           "samples_per_s": int(hit[4]), "seconds": seconds})  # fmt: skip
            last = now
    if process.wait():
        raise SystemExit(f"the search failed ({process.returncode}): {flags}")
    wall = time.perf_counter() - started
    order = [p for p, _ in PHASES if p in marks]
    ends = [marks[p] for p in order[1:]] + [wall]
    phases = {p: round(end - marks[p], 1) for p, end in zip(order, ends, strict=True)}
    print(out.name, round(wall, 1), phases, flush=True)
    return {"wall_time_s": round(wall, 1), "phases_s": phases, "trials": trials}


if __name__ == "__main__":
    main()
