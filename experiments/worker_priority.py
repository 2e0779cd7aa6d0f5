"""What running Ray's workers at the driver's priority gives a search on a machine that
does something else too: the same tiny search with Ray's worker niceness (15) and with
ours (0), beside two busy processes at niceness 10, in one run.

    python experiments/worker_priority.py [--rounds 1]

Ray starts its workers, and with them every measurement (the ceiling, the profile,
the trials, verification), at niceness 15: below Ray's own daemons and below anything
else on the machine at the default priority, the one a training job runs at. Two
processes that spin at niceness 10 stand in for the rest of the machine (a notebook,
a data copy, another user's job, asking even for less than their share). Each round
runs the search both ways (rotated), in subprocesses, timing its progress lines, and
reads the first trial's samples/s (no workers: the same configuration both ways).
Writes results/benchmarks/worker_priority.json.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

from _common import TINY_SEARCH as FLAGS
from _common import save, search_rounds, timed_search
from raytune_loader.tuning import tuner

NICENESS = {"ray's default (15)": 15, "the driver's (ours)": tuner.WORKER_NICENESS}
BUSY = "while True: pass"
BUSY_NICENESS = 10


def measured(niceness: int, args: list[str]) -> dict[str, float]:
    """One search beside the busy processes: its wall time and first trial's speed."""
    busy = [subprocess.Popen(["nice", "-n", str(BUSY_NICENESS), sys.executable, "-c", BUSY])
            for _ in range(2)]  # fmt: skip
    try:
        lines = timed_search(
            f"from raytune_loader import tuner; tuner.WORKER_NICENESS = {niceness}", args
        )
    finally:
        for process in busy:
            process.kill()
            process.wait()
    first = next(line for _, line in lines if line.startswith("[1/"))
    return {
        "search_s": lines[-1][0],
        "first_trial_samples_per_s": float(re.search(r"(\d+) samples/s", first).group(1)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    runs, medians = search_rounds(
        list(NICENESS), args.rounds, lambda name, flags: measured(NICENESS[name], flags)
    )
    default, ours = (medians[name] for name in NICENESS)
    save("worker_priority", {
        "median": medians,
        "runs": runs,
        "ours_over_default_search_s": ours["search_s"] / default["search_s"],
        "ours_over_default_first_trial_samples_per_s":
            ours["first_trial_samples_per_s"] / default["first_trial_samples_per_s"],
        "flags": " ".join(FLAGS),
        "method": f"{args.rounds} rotated rounds, the CLI search in a subprocess with "
        f"tuner.WORKER_NICENESS at Ray's default or ours, beside two processes spinning at "
        f"niceness {BUSY_NICENESS}; times from its output lines",
    })  # fmt: skip


if __name__ == "__main__":
    main()
