"""How long the search's process takes to end once its work is done, with its heap
frozen out of the shutdown's garbage collection (``console.freeze_at_exit``) and
without.

    python experiments/cli_exit.py [--rounds 3]

Runs the CLI search on the tests' tiny flags (one trial) in a subprocess, both ways in
each round, the order rotated. The subprocess notes the time when ``main`` returns
(after the results are written and Ray is stopped); the time from there to the
process's end is the exit. For "not frozen" the exit handler is unregistered before
the process ends, so that everything else is the same. Every search from the command
line ends this way, and so does every test's.

Writes results/benchmarks/cli_exit.json. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import TINY_SEARCH, save
from raytune_loader.sources import synthetic
from raytune_loader.verdict.selection import rotated

VARIANTS = ("frozen", "not frozen")
CODE = """
import atexit, gc, sys, time
from raytune_loader.search import main
status = main(sys.argv[2:])
if sys.argv[1] == "not frozen":
    atexit.unregister(gc.freeze)
sys.stderr.write(f"returned at {time.monotonic()}\\n")
sys.exit(status)
"""


def exit_seconds(variant: str, flags: list[str]) -> float:
    """One search; the seconds from ``main``'s return to the process's end."""
    result = subprocess.run([sys.executable, "-c", CODE, variant, *flags],
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    ended = time.monotonic()  # CLOCK_MONOTONIC: the same clock in both processes
    if result.returncode != 0:
        sys.exit(f"error: the search failed ({variant}): {result.stderr[-2000:]}")
    returned = float(result.stderr.rsplit("returned at ", 1)[1].split()[0])
    return ended - returned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        synthetic.ensure_synthetic_imagenet(root, num_images=96)
        flags = [*TINY_SEARCH, "--num-samples", "1", "--data-root", str(root),
                 "--out", str(Path(tmp) / "results")]  # fmt: skip
        runs: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        for round_, variant in rotated(VARIANTS, args.rounds):
            runs[variant].append(exit_seconds(variant, flags))
            print(f"round {round_ + 1}: {variant} exit {runs[variant][-1]:.2f} s", flush=True)
    medians = {variant: statistics.median(values) for variant, values in runs.items()}
    save("cli_exit", {
        "what": "seconds from the search's main returning to its process's end; the tests' "
                "tiny search with one trial, both ways each round, the order rotated",
        "exit_s": {v: {"median": medians[v], "min": min(runs[v]), "max": max(runs[v]),
                       "values": runs[v]} for v in VARIANTS},
        "ratio_frozen_vs_not": medians["frozen"] / medians["not frozen"],
        "rounds": args.rounds,
    })  # fmt: skip


if __name__ == "__main__":
    main()
