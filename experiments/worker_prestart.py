"""What prestarting no workers saves a search: the same tiny search with Ray's
prestart (a Python worker per CPU for the first driver, which ray.init waits for) and
without it (ours), in one run.

    python experiments/worker_prestart.py [--rounds 3]

Ray starts the prestarted workers with no runtime_env. Every task of a search runs in
the driver's runtime_env and every trial in Tune's, so none of those workers ever runs
anything. Each round runs the search both ways (rotated), in subprocesses, and reads
the phases and the processes as experiments/search_phases.py does. It reports Ray's
start, the search from Ray's start to its end, the Ray worker processes (and those
that never ran anything), and the CPU time they and the whole search used. Writes
results/benchmarks/worker_prestart.json.
"""

from __future__ import annotations

import argparse

from _common import TINY_SEARCH, save, search_rounds
from raytune_loader.tuning import tuner
from search_phases import PHASES, run_once

PRESTART = {"ray's prestart": True, "none (ours)": tuner.PRESTART_WORKERS}
RAY_START = "pre-warm, ray start"
_NAMES = [name for name, _ in PHASES]
AFTER_DATA = (*_NAMES[_NAMES.index(RAY_START) :], "exit")  # the phases from Ray's start on


def measure(name: str, flags: list[str]) -> dict[str, float]:
    run = run_once(flags, f"from raytune_loader import tuner; tuner.PRESTART_WORKERS = "
                          f"{PRESTART[name]}")  # fmt: skip
    phases, cpu = run["phases_s"], run["cpu_s"]
    idle = [p for p in run["processes"] if p[0].startswith("ray workers") and p[4] == "ray::IDLE"]
    return {
        "ray_start_s": phases[RAY_START],
        "ray_start_to_end_s": sum(phases.get(phase, 0.0) for phase in AFTER_DATA),
        "ray_worker_processes": run["ray_worker_processes"],
        "never_used_workers": len(idle),
        "ray_workers_cpu_s": cpu.get("ray workers (tasks, trial actors)", 0.0),
        "cpu_total_s": sum(cpu.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs, medians = search_rounds(list(PRESTART), args.rounds, measure)
    prestart, ours = (medians[name] for name in PRESTART)
    save("worker_prestart", {
        "median": medians,
        "runs": runs,
        "ours_over_prestart_ray_start_to_end": ours["ray_start_to_end_s"]
        / prestart["ray_start_to_end_s"],
        "flags": " ".join(TINY_SEARCH),
        "method": f"{args.rounds} rotated rounds, the CLI search in a subprocess with "
        "tuner.PRESTART_WORKERS at Ray's default (True) or ours; phases from its output "
        "lines, processes and CPU time as experiments/search_phases.py reads them (a "
        "worker never used is one never titled other than ray::IDLE)",
    })  # fmt: skip


if __name__ == "__main__":
    main()
