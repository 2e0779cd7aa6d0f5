"""Two data-parallel ranks sharing one GPU, as ``--ranks-per-node 2`` runs them there.

    python experiments/ranks_one_gpu.py [--ranks 2] [--batch-size 128] [--steps 16]

The ranks of a measurement (raytune_loader.measuring.ranks: forkserver children of this
process, each with half the GPU's memory, as a trial of ``--gpus-per-trial 1`` gives
them) answer three things: which process-group backend they joined (the docs: NCCL
when each rank has a GPU of its own, gloo when they share one, which NCCL refuses)
and the GPU each saw; the ceiling of the ranks together; and the rule of thumb per
rank (min(CPUs / ranks, 8) workers) trained by all ranks at once, against it. No Ray:
the same rank processes a trial's Ray task starts.

Writes ranks_one_gpu.json.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Any

import torch

from _common import add_images_flag, default_job, save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.machine import hardware
from raytune_loader.measuring import ranks
from raytune_loader.measuring.job import TrialJob
from raytune_loader.outputs.console import freeze_at_exit


def joined(job: TrialJob, report: Any) -> dict[str, Any]:
    """A rank's task: the backend it joined and the GPU it sees."""
    import torch.distributed as dist

    return {
        "backend": dist.get_backend(),
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": torch.cuda.current_device() if torch.cuda.is_initialized() else None,
        "device_count": torch.cuda.device_count(),
    }


def main() -> None:
    freeze_at_exit()  # a stage of gpu_check.sh: it exits as quickly as the command lines
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128, help="a rank's")
    parser.add_argument("--steps", type=int, default=16, help="measured steps")
    add_images_flag(parser)
    args = parser.parse_args()
    node_batch = args.batch_size * args.ranks
    job = default_job(steps=args.steps, largest_batch=node_batch, images=args.synthetic_images)
    cuda = job.device == "cuda"
    job = replace(job, ranks=args.ranks, gpu_memory_share=1 / args.ranks if cuda else 1.0)
    # a private helper of ranks.py: the rank processes themselves, with a task of ours
    backends = [run.value for run in ranks._run_ranks(job, joined, (), None)]
    print(f"ranks joined: {backends}", flush=True)
    size, ceiling = ranks.measure_ceiling(job, args.batch_size)
    print(f"ceiling of {args.ranks} ranks at {size} each: {ceiling:.0f} samples/s", flush=True)
    workers = min(hardware.usable_cpus() // args.ranks, 8)
    config = LoaderConfig(args.batch_size, workers, 2 if workers else None, cuda, workers > 0)
    outcome = ranks.run_trial(replace(job, ceilings={size: ceiling}), config)
    metrics = outcome.metrics
    print(f"{config.label()}: {metrics.samples_per_s if metrics else outcome.detail}", flush=True)
    save(
        "ranks_one_gpu",
        {
            "device": job.device,
            "ranks": args.ranks,
            "ranks_joined": backends,
            "ceiling_batch_size": size,
            "ceiling_samples_per_s": ceiling,
            "config": config.kwargs(),
            "samples_per_s": metrics.samples_per_s if metrics else None,
            "efficiency": outcome.efficiency,
            "rank_samples_per_s": [r.samples_per_s for r in outcome.ranks],
            "steady": metrics.steady if metrics else None,
            "failure": outcome.failure,
            "detail": outcome.detail,
        },
    )
    if outcome.failure:
        raise SystemExit(f"error: the two-rank trial failed ({outcome.failure}: {outcome.detail})")


if __name__ == "__main__":
    main()
