"""Tuned vs the usual choices, measured side by side in one run.

Runs the real search on the embedded default dataset (or takes the tuned config
from --config), then measures pytorch-default, heuristic and tuned interleaved,
--repeats times each, in one process with the whole machine.

    python experiments/baselines.py [--config results/synthetic-imagenet/best_config.json]

Writes results/benchmarks/baselines.json: samples/s and util of each, and
speedup_vs_pytorch_default / speedup_vs_heuristic (median and range of the
per-round ratios).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _common import add_images_flag, default_job, save
from raytune_loader import SearchOptions, load_best_config, run_search
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.measure import run_trial
from raytune_loader.outputs.console import freeze_at_exit
from raytune_loader.tuning.space import HEURISTIC, PYTORCH_DEFAULT
from raytune_loader.verdict.selection import rotated


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def tuned_config(config_path: str | None) -> tuple[LoaderConfig, dict[str, LoaderConfig], float]:
    if config_path is None:
        started = time.monotonic()
        out = tempfile.mkdtemp(prefix="baselines-")
        result = run_search(SearchOptions(out=out))
        config_path = str(Path(result.out_dir) / "best_config.json")
        search_s = time.monotonic() - started
    else:
        search_s = float("nan")
    best = load_best_config(config_path)
    baselines = {
        name: LoaderConfig.from_dict(entry["loader"])
        for name, entry in best.data["baselines"].items()
    }
    return best.loader, baselines, search_s


def main() -> None:
    freeze_at_exit()  # a stage of gpu_check.sh: it exits as quickly as the command lines
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", help="an existing best_config.json (default: search now)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60, help="measured steps per run")
    add_images_flag(parser)
    args = parser.parse_args()
    tuned, baselines, search_s = tuned_config(args.config)
    configs = {PYTORCH_DEFAULT: baselines[PYTORCH_DEFAULT], HEURISTIC: baselines[HEURISTIC],
               "tuned": tuned}  # fmt: skip
    largest = max(config.batch_size for config in configs.values())
    job = default_job(steps=args.steps, largest_batch=largest, images=args.synthetic_images)
    speed: dict[str, list[float]] = {name: [] for name in configs}
    util: dict[str, list[float]] = {name: [] for name in configs}
    for repeat, name in rotated(list(configs), args.repeats):
        metrics = run_trial(job, configs[name]).metrics
        assert metrics is not None
        speed[name].append(metrics.samples_per_s)
        util[name].append(metrics.util)
        print(f"round {repeat + 1}: {name:<16} {metrics.samples_per_s:7.1f} samples/s", flush=True)
    ratios = {
        base: [t / b for t, b in zip(speed["tuned"], speed[base], strict=True)]
        for base in (PYTORCH_DEFAULT, HEURISTIC)
    }
    save(
        "baselines",
        {
            "dataset": job.dataset.name,
            "model": job.model,
            "configs": {name: config.kwargs() for name, config in configs.items()},
            "pipelines": {name: config.pipeline() for name, config in configs.items()},
            "samples_per_s": {name: spread(values) for name, values in speed.items()},
            "util": {name: spread(values) for name, values in util.items()},
            "speedup_vs_pytorch_default": spread(ratios[PYTORCH_DEFAULT]),
            "speedup_vs_heuristic": spread(ratios[HEURISTIC]),
            "targets": {"vs_pytorch_default_at_least": 1.3, "vs_heuristic_not_below_noise": True},
            "repeats": args.repeats,
            "search_wall_s": search_s,
        },
    )


if __name__ == "__main__":
    main()
