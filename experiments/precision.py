"""How fast the model trains in each precision: the ceiling the loader must feed.

    python experiments/precision.py [--batch-size B] [--rounds 3]

Measures the ceiling (the job's model on a batch already on the device) in fp32,
tf32 and bf16 (on CUDA also bf16 with channels-last, as people train conv nets
there), side by side in rotated rounds, and writes results/benchmarks/precision.json
(results/gpu/precision.json with BENCH_DIR): samples/s of each, and each one's
ratio to fp32. A loader tuned for the fp32 step is under-provisioned for a step
that runs faster.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from _common import add_images_flag, default_job, save
from raytune_loader.measuring.measure import measure_ceiling
from raytune_loader.outputs.console import freeze_at_exit
from raytune_loader.verdict.selection import rotated


def main() -> None:
    freeze_at_exit()  # a stage of gpu_check.sh: it exits as quickly as the command lines
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, help="default: 256 on CUDA, 32 on a CPU")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="steps per measured window")
    add_images_flag(parser)
    args = parser.parse_args()
    base = default_job(steps=args.steps, images=args.synthetic_images)
    cuda = base.device == "cuda"
    batch = args.batch_size or (256 if cuda else 32)
    variants = {
        "fp32": replace(base, precision="fp32", channels_last=False),
        "tf32": replace(base, precision="tf32", channels_last=False),
        "bf16": replace(base, precision="bf16", channels_last=False),
    }
    if cuda:
        variants["bf16+channels_last"] = replace(base, precision="bf16", channels_last=True)
    speeds: dict[str, list[float]] = {name: [] for name in variants}
    for repeat, name in rotated(list(variants), args.rounds):
        effective, speed = measure_ceiling(variants[name], batch)
        assert effective == batch, f"{name} backed off to batch {effective}"
        speeds[name].append(speed)
        print(f"round {repeat + 1}: {name:<20} {speed:8.1f} samples/s", flush=True)
    medians = {name: statistics.median(values) for name, values in speeds.items()}
    save(
        "precision",
        {
            "model": base.model,
            "device": base.device,
            "batch_size": batch,
            "compute_threads": base.segment.compute_threads,
            "ceiling_samples_per_s": speeds,
            "median": medians,
            "over_fp32": {name: medians[name] / medians["fp32"] for name in medians},
        },
    )


if __name__ == "__main__":
    main()
