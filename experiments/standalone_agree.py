"""The search's verified winner against the same loader measured standalone.

Runs the real search on the embedded default dataset (the default command's options),
then, in rotated rounds, each in a fresh process without Ray:

- ``bench``: ``python -m raytune_loader.bench --config best_config.json`` (the
  tuned configuration's median of its runs, measured as a trial is);
- ``loop``: the README's training loop (``tuned.dataloader(tuned.dataset())``,
  ``tuned.to_device``, the search's model and step, one compute thread as a trial),
  timed with the plain clock over as many steps as a trial measures, after as many
  as a trial trains before its window.

    python experiments/standalone_agree.py [--rounds 3]

Writes results/benchmarks/standalone_agree.json: the verified median, each way's
runs and median, and their ratios (target: the bench within 5% of the verification,
and within the verification's own spread).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import save
from raytune_loader import load_best_config
from raytune_loader.verdict.selection import rotated

# The README's loop, as a user writes it: the tuned loader, the device-side stages,
# the model and step the search trained, the trial's compute threads; the first
# `warm` steps untimed, the next `steps` timed with the wall clock.
LOOP = """
import json, sys, time, torch
from raytune_loader import load_best_config
from raytune_loader.measuring.job import SegmentSpec
from raytune_loader.engines import engine_of
from raytune_loader.measuring.models import build_model

path = sys.argv[1]
tuned = load_best_config(path)
best = tuned.data
segment = best["search"]["segment"]
torch.set_num_threads(segment["compute_threads"])
dataset = tuned.dataset()
model = build_model(best["model"], 100)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
config = tuned.loader
spec = SegmentSpec(**segment)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "raytune_loader.search", "--out", str(out)], check=True
        )
        search_s = time.perf_counter() - started
        best_path = next(out.glob("*/best_config.json"))
        best = load_best_config(best_path).data
        runs: dict[str, list[float]] = {"bench": [], "loop": []}
        for repeat, way in rotated(list(runs), args.rounds):
            speed = bench(best_path, Path(tmp)) if way == "bench" else loop(best_path)
            runs[way].append(speed)
            print(f"round {repeat + 1}: {way:<6} {speed:.0f} samples/s", flush=True)
    verified = best["metrics"]["samples_per_s"]
    medians = {way: statistics.median(found) for way, found in runs.items()}
    ratios = {way: median / verified["median"] for way, median in medians.items()}
    within_spread = {
        way: verified["min"] * 0.95 <= median <= verified["max"] * 1.05
        for way, median in medians.items()
    }
    save(
        "standalone_agree",
        {
            "search_wall_s": search_s,
            "winner": best["loader"] | best.get("pipeline", {}),
            "verified_samples_per_s": verified,
            "verified_steady": best["metrics"].get("steady"),
            "runs": runs,
            "medians": medians,
            "over_verified": ratios,
            "within_verification_spread_5pct": within_spread,
            "target": "the bench within 5% of the verified median",
            "met": abs(ratios["bench"] - 1) <= 0.05,
            "rounds": args.rounds,
        },
    )


def bench(best_path: Path, tmp: Path) -> float:
    """The tuned configuration's median samples/s of one bench run (fresh process)."""
    figures = tmp / "bench.json"
    subprocess.run(
        [sys.executable, "-m", "raytune_loader.bench", "--config", str(best_path),
         "--repeats", "1", "--json", str(figures)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return json.loads(figures.read_text())["metrics"]["samples_per_s"]["median"]


def loop(best_path: Path) -> float:
    """The README's loop, in a fresh process: samples/s over a trial's measured steps."""
    code = (
        LOOP
        + """
warm = spec.warmup_steps + engine_of(config).in_flight()  # a trial's steps before its window
steps = spec.steps
batches = iter(tuned.dataloader(dataset))
for i in range(warm + steps):
    if i == warm:
        start = time.perf_counter()
    images, labels = tuned.to_device(next(batches), "cpu")
    optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    optimizer.step()
print(images.shape[0] * steps / (time.perf_counter() - start))
"""
    )
    found = subprocess.run(
        [sys.executable, "-c", code, str(best_path)], check=True, capture_output=True, text=True
    )
    return float(found.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
