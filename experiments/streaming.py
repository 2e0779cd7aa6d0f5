"""The same 2,000 images as a folder, as webdataset shards and as Parquet: a search on each.

The embedded default dataset is written as 8 webdataset shards and 8 Parquet files
(experiments/to_shards.py), then searched three ways with the same options: tuned
against pytorch-default and the rule of thumb (verified, median samples/s), the
time to the first batch of every configuration tried, and the peak memory (RSS of
the trial's process and its workers) of one trial of the tuned configuration,
each in a fresh process.

    python experiments/streaming.py [--trials 8]

Writes results/benchmarks/streaming.json (target: the webdataset trial's peak RSS
within 1.5x the image folder's).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from _common import default_job, save
from raytune_loader import SearchOptions, run_search
from to_shards import images_of, write_parquet, write_webdataset

PEAK_TRIAL = """
import sys, json
from raytune_loader import load_best_config
from raytune_loader.tuning.options import job_from_options
from raytune_loader.measuring.prepare import prepare_data
from raytune_loader.outputs.reader import recorded_options
from raytune_loader.measuring.measure import run_trial
best = load_best_config(sys.argv[1])
options = recorded_options(best.data, sys.argv[1])
job = prepare_data(job_from_options(options, 'small-cnn', device='cpu', node_cpus=2),
                   best.loader.batch_size)
outcome = run_trial(job, best.loader)
print(json.dumps({"samples_per_s": outcome.metrics.samples_per_s if outcome.metrics else 0}))
"""


def peak_rss(config: Path) -> tuple[float, float]:
    """(peak MB of the trial's process and its workers together, its samples/s)."""
    child = subprocess.Popen([sys.executable, "-c", PEAK_TRIAL, str(config)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    process, peak = psutil.Process(child.pid), 0
    while child.poll() is None:
        try:
            tree = [process, *process.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.05)
    if child.returncode:
        raise SystemExit(f"the peak-memory trial of {config} failed (exit {child.returncode})")
    out = json.loads((child.stdout.read() if child.stdout else "{}").strip().splitlines()[-1])
    return peak / 2**20, out["samples_per_s"]


def searched(name: str, root: str, out: Path, trials: int) -> dict:
    started = time.monotonic()
    result = run_search(SearchOptions(dataset=name, data_root=root, out=str(out),
                                      num_samples=trials))  # fmt: skip
    best = result.best_config
    with open(Path(result.out_dir) / "trials.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r["first_batch_s"]]
    speeds = {"tuned": best["metrics"]["samples_per_s"]["median"]}
    speeds.update(
        {n: b["metrics"]["samples_per_s"]["median"] for n, b in best["baselines"].items()}
    )
    peak, alone = peak_rss(Path(result.out_dir) / "best_config.json")
    return {
        "dataset": name,
        "search_wall_s": time.monotonic() - started,
        "tuned": {**best["loader"], **best.get("pipeline", {})},
        "samples_per_s": speeds,
        "speedup": best["speedup"],
        "first_batch_s": {
            "tuned": best["metrics"]["first_batch_s"]["median"],
            "per_trial": [
                {
                    "config": f"workers={r['num_workers']} {r['workers']} {r['access']} "
                    f"batching={r['batching']}",
                    "first_batch_s": float(r["first_batch_s"]),
                }
                for r in rows
            ],  # fmt: skip
            "median_over_trials": statistics.median(float(r["first_batch_s"]) for r in rows),
        },
        "tuned_trial_peak_rss_mb": peak,
        "tuned_trial_samples_per_s": alone,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=8)
    args = parser.parse_args()
    job = default_job()
    root = Path(job.dataset.resolved_root() or "")
    with tempfile.TemporaryDirectory(prefix="streaming-") as scratch:
        data = Path(scratch)
        files, labels, classes = images_of(root / "train")
        write_webdataset(files, labels, data / "webdataset", 8)
        write_parquet(files, labels, classes, data / "parquet", 8)
        runs = {
            "imagefolder": searched("imagefolder", str(root / "train"), data / "out", args.trials),
            "webdataset": searched(
                "webdataset", str(data / "webdataset"), data / "out", args.trials
            ),  # fmt: skip
            "parquet": searched("hf", str(data / "parquet"), data / "out", args.trials),
        }
    folder = runs["imagefolder"]["tuned_trial_peak_rss_mb"]
    save("streaming", {
        "images": len(files), "shards": 8, "trials_per_search": args.trials,
        "runs": runs,
        "peak_rss_vs_imagefolder": {k: v["tuned_trial_peak_rss_mb"] / folder
                                    for k, v in runs.items()},  # fmt: skip
        "target": "webdataset trial's peak RSS within 1.5x the image folder's",
        "how": "python experiments/streaming.py --trials " + str(args.trials),
    })  # fmt: skip


if __name__ == "__main__":
    main()
