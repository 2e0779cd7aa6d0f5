"""What keeping Ray's idle workers saves a search: the same tiny search with Ray's own
idle limit (1 s) and with ours, in one run.

    python experiments/warm_worker.py [--rounds 2]

A search measures the ceiling in a Ray task, runs its trials as Tune actors that hold
the node's CPUs, then verifies in Ray tasks again. With Ray's default a task's worker
idle for 1 s is ended once the trials hold the CPUs, so verification starts a new
process and imports torch again; our instance keeps it (tuner.IDLE_WORKER_KEEP_MS).
Each round runs the search both ways (rotated), in subprocesses, timing its progress
lines: from Ray's start to the end of the search (the data prepared before is left
out) and verification's first two measurements. Writes
results/benchmarks/warm_worker.json.
"""

from __future__ import annotations

import argparse

from _common import TINY_SEARCH as FLAGS
from _common import save, search_rounds, timed_search
from raytune_loader.tuning import tuner

KEEP = {"ray's default (1 s)": 1000, "kept (ours)": tuner.IDLE_WORKER_KEEP_MS}


def timed_lines(keep_ms: int, args: list[str]) -> list[tuple[float, str]]:
    """The search's output lines, each with the seconds since it started."""
    return timed_search(
        f"from raytune_loader import tuner; tuner.IDLE_WORKER_KEEP_MS = {keep_ms}", args
    )


def phases(lines: list[tuple[float, str]]) -> dict[str, float]:
    def first(text: str) -> float:
        return next(t for t, line in lines if text in line)

    verifying = [t for t, line in lines if "verifying" in line]
    return {
        "ray_start_to_end_s": lines[-1][0] - first("dashboard"),
        "verification_first_two_runs_s": verifying[1] - verifying[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    runs, medians = search_rounds(
        list(KEEP), args.rounds, lambda name, flags: phases(timed_lines(KEEP[name], flags))
    )
    default, kept = (medians[name]["ray_start_to_end_s"] for name in KEEP)
    save("warm_worker", {
        "median": medians,
        "runs": runs,
        "kept_over_default_ray_start_to_end": kept / default,
        "flags": " ".join(FLAGS),
        "method": f"{args.rounds} rotated rounds, the CLI search in a subprocess with "
        "tuner.IDLE_WORKER_KEEP_MS at Ray's default or ours; times from its output lines",
    })  # fmt: skip


if __name__ == "__main__":
    main()
