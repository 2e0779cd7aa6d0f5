"""What the steady window costs: the default command's time to an answer, before and after.

Checks out ``--before`` (the code before the steady window) into a scratch worktree and
runs the default command (``python -m raytune_loader.search``) from it and from this
tree, in rotated rounds, each a fresh process on a scratch output folder; the embedded
dataset is the same cached folder for both.

    python experiments/steady_cost.py [--before fb93447] [--rounds 2]

Writes results/benchmarks/steady_cost.json: each run's wall time to the summary and
the median ratio after / before (target: at most 1.2).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import save
from raytune_loader.verdict.selection import rotated

REPO = Path(__file__).resolve().parent.parent


def timed(tree: Path, out: Path) -> float:
    """Seconds from the command to its end (the summary printed), importing from ``tree``."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "raytune_loader.search", "--out", str(out)],
        check=True, stdout=subprocess.DEVNULL, cwd=tree, env=_env(tree),
    )  # fmt: skip
    return time.perf_counter() - started


def _env(tree: Path) -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(tree)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="fb93447")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(old),
                        args.before], check=True)  # fmt: skip
        try:
            trees = {"before": old, "after": REPO}
            runs: dict[str, list[float]] = {name: [] for name in trees}
            for repeat, name in rotated(list(trees), args.rounds):
                seconds = timed(trees[name], Path(tmp) / f"out-{name}-{repeat}")
                runs[name].append(seconds)
                print(f"round {repeat + 1}: {name:<7} {seconds:.1f} s", flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)],
                           check=False)  # fmt: skip
    medians = {name: statistics.median(found) for name, found in runs.items()}
    ratio = medians["after"] / medians["before"]
    save(
        "steady_cost",
        {
            "before": args.before,
            "runs_s": runs,
            "median_s": medians,
            "after_over_before": ratio,
            "target": "the default command's time to an answer grows by at most 20%",
            "met": ratio <= 1.2,
            "rounds": args.rounds,
        },
    )


if __name__ == "__main__":
    main()
