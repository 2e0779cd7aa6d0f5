"""Every pipeline variant that runs on a CPU against today's best DataLoader-only one.

    python experiments/pipeline_variants.py [--rounds 3]

On synthetic-imagenet with the default job: the DataLoader configuration of the
last search (2 workers, prefetch 2, persistent) with the images normalized in the
workers (float32, today's pipeline), then the same loader with uint8 transfer
finished on the device, out-of-order batches, and the forkserver and spawn start
methods; each measured in rotated rounds, plus the decode-and-augment rate of one
core for each transfer. Writes results/benchmarks/pipeline_variants.json. There is
no target on two cores: the variants are about bytes moved and start-up, which a
GPU node feels and a 2-core CPU machine barely does.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from _common import decode_rate, default_job, save
from raytune_loader.measure import run_trial
from raytune_loader.selection import rotated
from raytune_loader.space import LoaderConfig

BASE = LoaderConfig(32, 2, 2, False, True)
VARIANTS = {
    "float32 (today)": BASE,
    "uint8 transfer": replace(BASE, transfer="uint8"),
    "uint8, out of order": replace(BASE, transfer="uint8", in_order=False),
    "uint8, forkserver": replace(BASE, transfer="uint8", multiprocessing_context="forkserver"),
    "uint8, spawn": replace(BASE, transfer="uint8", multiprocessing_context="spawn"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    job = default_job()
    speeds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for repeat, name in rotated(list(VARIANTS), args.rounds):
        outcome = run_trial(job, VARIANTS[name])
        assert outcome.metrics is not None, outcome.detail
        speeds[name].append(outcome.metrics.samples_per_s)
        print(f"round {repeat + 1}: {name:<22} {speeds[name][-1]:6.1f} samples/s", flush=True)
    medians = {name: statistics.median(values) for name, values in speeds.items()}
    base = medians["float32 (today)"]
    save(
        "pipeline_variants",
        {
            "loader": BASE.kwargs(),
            "samples_per_s": speeds,
            "median": medians,
            "over_float32": {name: value / base for name, value in medians.items()},
            "decode_augment_per_core": {t: decode_rate(job, 192, t) for t in ("float32", "uint8")},
            "device": job.device,
        },
    )


if __name__ == "__main__":
    main()
