"""The physical limit: how fast could any loader feed this model on this machine?

Measures the dataset pipeline alone (decode + augment, one core) and the model's
ceiling (training on a batch already on the device), derives the best throughput
any DataLoader configuration could reach, and compares the tuned one to it.

    python experiments/limits.py [--config results/synthetic-imagenet/best_config.json]

On a CPU the model and the decoding share the cores: the limit is
min(ceiling, cpus / (1/decode_rate + 1/ceiling)). On a GPU the model runs
elsewhere: min(ceiling, cpus x decode_rate).
Writes results/benchmarks/limits.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import RESULTS, add_images_flag, decode_rate, default_job, save
from raytune_loader import load_best_config
from raytune_loader.machine import hardware
from raytune_loader.measuring.measure import measure_ceiling, run_trial
from raytune_loader.outputs.console import freeze_at_exit


def main() -> None:
    freeze_at_exit()  # a stage of gpu_check.sh: it exits as quickly as the command lines
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="results/synthetic-imagenet/best_config.json")
    parser.add_argument("--steps", type=int, default=60, help="measured steps per run")
    add_images_flag(parser)
    args = parser.parse_args()
    best = load_best_config(args.config) if Path(args.config).exists() else None
    batch = best.loader.batch_size if best else 32  # the ceiling at the tuned batch size
    job = default_job(steps=args.steps, largest_batch=batch, images=args.synthetic_images)
    cpus = hardware.usable_cpus()
    recorded = RESULTS / "baselines.json"
    figures = json.loads(recorded.read_text()) if recorded.exists() else {}
    # the worker side of the tuned pipeline's variant: its decoder and transfer
    pipeline = best.loader.pipeline() if best else figures.get("pipelines", {}).get("tuned", {})
    transfer, decode = pipeline.get("transfer", "float32"), pipeline.get("decode", "pil")
    per_core = decode_rate(job, transfer=transfer, decode=decode)
    _, ceiling = measure_ceiling(job, batch)
    if job.device == "cuda":
        limit = min(ceiling, cpus * per_core)
    else:
        limit = min(ceiling, cpus / (1 / per_core + 1 / ceiling))
    tuned_speed, source = None, None
    if best is not None:
        outcome = run_trial(job, best.loader)
        tuned_speed = outcome.metrics.samples_per_s if outcome.metrics else None
        source = args.config
    elif figures:
        tuned_speed = figures["samples_per_s"]["tuned"]["median"]
        source = "results/benchmarks/baselines.json"
    save(
        "limits",
        {
            "decode_augment_samples_per_s_per_core": per_core,
            "worker_side": {"decode": decode, "transfer": transfer},
            "ceiling_samples_per_s": ceiling,
            "ceiling_batch_size": batch,
            "usable_cpus": cpus,
            "device": job.device,
            "limit_samples_per_s": limit,
            "tuned_samples_per_s": tuned_speed,
            "tuned_source": source,
            "tuned_fraction_of_limit": tuned_speed / limit if tuned_speed else None,
        },
    )


if __name__ == "__main__":
    main()
