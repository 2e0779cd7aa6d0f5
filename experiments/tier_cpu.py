"""Where the test tiers' time goes: whether the machine's CPUs are busy or waiting.

Runs the README's test commands (``pytest -q``, ``pytest -q -m slow -n 0``) and reads
the machine's CPU counters (``/proc/stat``) before, after and every second between,
then the cost of one fresh Python process that imports torch and torchvision (every
Ray worker, trainer script and CLI call pays it). A tier whose CPUs are busy nearly
all of its run is bound by the work it does, not by waits: more tests side by side
cannot make it shorter, less work can.

    python experiments/tier_cpu.py [--tiers fast,slow] [--workers N]

Writes results/benchmarks/test_tiers_cpu.json (each tier's entry replaced, the
others kept) and each tier's pytest output beside it (test_tiers_cpu_<tier>.log).
Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(os.environ.get("BENCH_DIR", REPO / "results" / "benchmarks"))
TIERS = {"fast": ["pytest", "-q"], "slow": ["pytest", "-q", "-m", "slow"]}
WORKERS = {"fast": None, "slow": 0}  # the README's -n: pyproject's three, or one process
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
SATURATED = 0.9  # a second whose CPUs were this busy counts as saturated


def _counters() -> dict[str, int]:
    with open("/proc/stat") as stat:
        values = stat.readline().split()[1 : 1 + len(FIELDS)]
    return dict(zip(FIELDS, map(int, values), strict=True))


def _shares(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Each counter's share of the CPU time between two readings."""
    delta = {name: after[name] - before[name] for name in FIELDS}
    total = sum(delta.values()) or 1
    return {name: value / total for name, value in delta.items()}


def _busy(shares: dict[str, float]) -> float:
    return 1 - shares["idle"] - shares["iowait"]


@dataclass(frozen=True)
class TierRun:
    command: str
    summary: str  # pytest's last line
    returncode: int
    wall_s: float
    busy_share: float  # of all cores, over the whole run
    shares: dict[str, float]  # user, nice (the tests' lowered workers), system, steal
    busy_core_s: float
    saturated_share: float  # of the run's seconds, busy above SATURATED


def run_tier(command: list[str], log: Path) -> TierRun:
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        last = _counters()
        while not stop.wait(1.0):
            now = _counters()
            samples.append(_busy(_shares(last, now)))
            last = now

    sampler = threading.Thread(target=sample, daemon=True)
    before, started = _counters(), time.monotonic()
    sampler.start()
    done = subprocess.run([sys.executable, "-m", *command], cwd=REPO, capture_output=True,
                          text=True)  # fmt: skip
    wall, after = time.monotonic() - started, _counters()
    log.write_text(done.stdout + done.stderr)
    stop.set()
    sampler.join()
    shares = _shares(before, after)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    busy = _busy(shares)
    return TierRun(
        command=" ".join(command),
        summary=lines[-1] if lines else done.stderr[-300:],
        returncode=done.returncode,
        wall_s=round(wall, 1),
        busy_share=round(busy, 3),
        shares={name: round(shares[name], 3) for name in ("user", "nice", "system", "steal")},
        busy_core_s=round(busy * wall * os.cpu_count(), 0),
        saturated_share=round(sum(s > SATURATED for s in samples) / max(len(samples), 1), 3),
    )


def import_cost(module: str, repeats: int = 3) -> dict[str, float]:
    """The fastest of ``repeats`` fresh interpreters importing ``module``: wall and CPU."""
    best: tuple[float, float] | None = None
    for _ in range(repeats):
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
        wall = time.monotonic() - started
        now = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = now.ru_utime - used.ru_utime + now.ru_stime - used.ru_stime
        if best is None or wall < best[0]:
            best = (wall, cpu)
    assert best is not None
    return {"wall_s": round(best[0], 2), "cpu_s": round(best[1], 2)}


def _cpu_model() -> str:
    text = Path("/proc/cpuinfo").read_text()
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return found.group(1) if found else platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiers", default="fast,slow", help="fast, slow or both (fast,slow)")
    parser.add_argument("--workers", type=int, help="pytest -n N instead of the README's")
    args = parser.parse_args()
    out = RESULTS / "test_tiers_cpu.json"
    figures = json.loads(out.read_text()) if out.exists() else {"tiers": {}}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    for tier in args.tiers.split(","):
        workers = WORKERS[tier] if args.workers is None else args.workers
        command = TIERS[tier] + ([] if workers is None else ["-n", str(workers)])
        print(f"{tier}: {' '.join(command)}", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        run = run_tier(command, out.with_name(f"test_tiers_cpu_{tier}.log"))
        print(f"  {run.summary}; CPUs busy {run.busy_share:.0%} of {run.wall_s:.0f} s "
              f"({run.busy_core_s:.0f} core-s), saturated {run.saturated_share:.0%} of the "
              "seconds", flush=True)  # fmt: skip
        figures["tiers"][tier] = {**asdict(run), "commit": commit}
    figures["imports"] = {m: import_cost(m) for m in ("torch", "torchvision", "ray")}
    figures["machine"] = {"cpu": _cpu_model(), "cores": os.cpu_count(),
                          "python": platform.python_version()}  # fmt: skip
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"imports (fresh interpreter): {figures['imports']}\nwrote {out}")


if __name__ == "__main__":
    main()
