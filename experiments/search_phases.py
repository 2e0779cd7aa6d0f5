"""Where one tiny search's time goes: its phases' wall time, and the CPU time of each
kind of process it starts.

    python experiments/search_phases.py [--rounds 2]

Runs the CLI search on the tests' tiny flags in a subprocess, `--rounds` times, on a
dataset generated once before. Its progress lines, timed as they arrive, give the
phases. Every process that inherits the run's mark in its environment is sampled
twice a second: the driver, Ray's daemons, Ray's worker processes (tasks and trial
actors) and the loader workers they fork; the CPU time each used is summed by kind.
A fresh interpreter importing what a Ray worker imports (Ray Tune, torch,
torchvision, the trial module) is timed too: every new process pays it. Every search
and every test of the slow tier pays these fixed costs, whatever its flags.

Writes results/benchmarks/search_phases.json. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from _common import TINY_SEARCH, save
from raytune_loader.sources import synthetic

MARK = "RAYTUNE_LOADER_PHASES_RUN"
SAMPLE_S = 0.5
# what a daemon's command line or process title holds
DAEMONS = ("gcs_server", "raylet/raylet", "dashboard/dashboard.py", "dashboard/agent.py",
           "runtime_env/agent", "log_monitor.py", "autoscaler/_private/monitor.py",
           "forkserver", "resource_tracker", "ray::DashboardAgent", "ray::RuntimeEnvAgent",
           "ray-dashboard-")  # fmt: skip
# (phase, the progress line that ends it), in the order a search prints them
PHASES = (
    ("start and imports", "==> Synthetic ImageNet"),
    ("data: the subset", "==> Pre-warming"),
    ("pre-warm, ray start", "Ray dashboard"),
    ("ceiling (first Ray task)", "==> Profiling"),
    ("profile", "==> Searching"),
    ("trials", "verifying"),
    ("verification", "measuring the input pipeline alone"),
    ("input alone, ray stop, results", "best config:"),
)
WORKER_IMPORTS = "import ray.tune, torch, torchvision, raytune_loader.tuning.trainable"


@dataclass
class Seen:
    names: set[str]  # its command lines and process titles, as sampled
    ppid: int
    cpu_s: float


def _marked(mark: str) -> Iterator[psutil.Process]:
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARK) == mark:
                yield process
        except psutil.Error:
            continue  # ended, or not ours to read


def _holds(seen: Seen, parts: tuple[str, ...]) -> bool:
    return any(part in name for name in seen.names for part in parts)


def _descendants(seen: dict[int, Seen], roots: set[int]) -> set[int]:
    found: set[int] = set()
    while more := {pid for pid, e in seen.items() if e.ppid in roots | found} - found:
        found |= more
    return found


def _kind(pid: int, seen: Seen, driver: int, workers: set[int], below: set[int]) -> str:
    if pid == driver:
        return "driver"
    if pid in workers:
        return "ray workers (tasks, trial actors)"
    if pid in below:
        return "below ray workers (loader workers, ranks)"
    return "ray daemons" if _holds(seen, DAEMONS) else "other"


def _titles(seen: Seen) -> str:
    """A Ray process's titles (ray::IDLE, ray::profile_task...), else its command line."""
    titles = sorted({name.strip() for name in seen.names if name.startswith("ray::")})
    return " ".join(titles) if titles else max(seen.names, key=len)[:90]


def run_once(flags: list[str], setup: str = "pass") -> dict[str, Any]:
    """One search, after the Python statements ``setup`` (a constant of the package
    changed, say): its phases' seconds, CPU seconds by kind of process, its processes."""
    mark = uuid.uuid4().hex
    code = (
        f"import sys; {setup}; from raytune_loader.search import main; sys.exit(main(sys.argv[1:]))"
    )
    start = time.monotonic()
    search = subprocess.Popen(
        [sys.executable, "-u", "-c", code, *flags], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env={**os.environ, MARK: mark},
    )  # fmt: skip
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in search.stdout:  # type: ignore[union-attr]
            lines.append((time.monotonic() - start, line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: dict[int, Seen] = {}
    while search.poll() is None:
        for process in _marked(mark):
            try:
                cpu, ppid = process.cpu_times(), process.ppid()
                cmdline = " ".join(process.cmdline())
            except psutil.Error:
                continue  # ended meanwhile
            entry = seen.setdefault(process.pid, Seen(set(), ppid, 0.0))
            entry.names.add(cmdline)
            entry.cpu_s = cpu.user + cpu.system
        time.sleep(SAMPLE_S)
    wall = time.monotonic() - start
    reader.join(timeout=10)
    if search.returncode != 0:
        raise SystemExit("\n".join(line for _, line in lines[-20:]))
    raylets = {pid for pid, entry in seen.items() if _holds(entry, ("raylet/raylet",))}
    workers = {pid for pid, entry in seen.items()  # what the raylet starts, its agents aside
               if entry.ppid in raylets and not _holds(entry, DAEMONS)}  # fmt: skip
    below = _descendants(seen, workers)
    cpu: dict[str, float] = {}
    table = []
    for pid, entry in seen.items():
        kind = _kind(pid, entry, search.pid, workers, below)
        cpu[kind] = cpu.get(kind, 0.0) + entry.cpu_s
        table.append((kind, round(entry.cpu_s, 1), pid, entry.ppid, _titles(entry)))
    return {"wall_s": wall, "phases_s": _phases(lines, wall), "cpu_s": cpu,
            "ray_worker_processes": len(workers), "processes": sorted(table)}  # fmt: skip


def _phases(lines: list[tuple[float, str]], wall: float) -> dict[str, float]:
    """Each phase's seconds: from the end of the one before to its own ending line."""
    phases, last = {}, 0.0
    for name, ending in PHASES:
        at = next((t for t, line in lines if ending in line), None)
        if at is None:
            continue  # a phase this search skipped
        phases[name], last = at - last, at
    phases["exit"] = wall - last
    return phases


def fresh_worker_import() -> dict[str, float]:
    """A new interpreter importing what a Ray worker of a search imports."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", WORKER_IMPORTS], check=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall_s": wall, "cpu_s": cpu}


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = dict.fromkeys(key for run in runs for key in run)  # in the order they came
    return {key: statistics.median(run.get(key, 0.0) for run in runs) for key in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    imports = [fresh_worker_import() for _ in range(args.rounds)]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        flags = [*TINY_SEARCH, "--data-root", str(data), "--out", str(Path(tmp) / "out")]
        images = int(TINY_SEARCH[TINY_SEARCH.index("--synthetic-images") + 1])
        synthetic.ensure_synthetic_imagenet(data, images)  # every round finds it made
        for round_ in range(args.rounds):
            runs.append(run_once(flags))
            print(f"round {round_ + 1}: {runs[-1]['wall_s']:.1f} s", flush=True)
    cpu = _median([run["cpu_s"] for run in runs])
    save("search_phases", {
        "wall_s": statistics.median(run["wall_s"] for run in runs),
        "phases_s": _median([run["phases_s"] for run in runs]),
        "cpu_s": cpu,
        "cpu_total_s": sum(cpu.values()),
        "ray_worker_processes": statistics.median(run["ray_worker_processes"] for run in runs),
        "fresh_worker_import": _median(imports),
        "runs": runs,
        "flags": " ".join(TINY_SEARCH),
        "method": f"{args.rounds} runs of the CLI search in a subprocess; phases from its "
        f"progress lines; CPU time of every process carrying the run's mark, sampled every "
        f"{SAMPLE_S} s (a process's last sample: up to {SAMPLE_S} s short of its end); a "
        f"fresh interpreter's `{WORKER_IMPORTS}` timed {args.rounds} times",
    })  # fmt: skip


if __name__ == "__main__":
    main()
