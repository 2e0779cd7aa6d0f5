"""``--compile`` with the out-of-memory back-off: what a smaller batch costs in recompiles.

    python experiments/compile_backoff.py [--model resnet18] [--batch-size 512]
        [--gpu-memory-gib 4] [--steps 16]

One trial of the default job (bf16, channels-last on CUDA; ``--model``, by default the
device's: resnet50, or the small CNN on a CPU) with ``torch.compile``, as ``--compile``
runs it, held to ``--gpu-memory-gib``
of the GPU's memory (the allocator's cap, as ``--gpus-per-trial`` sets it) so that
``--batch-size`` cannot fit: the trial compiles, runs out of memory, backs off and
trains at a batch that fits. Every recompilation dynamo makes is counted with the
guard that failed (what ``TORCH_LOGS=recompiles`` prints), and the trial's first
batch (the compile's share) and steady samples/s are recorded. On a CPU nothing runs
out of memory: it compiles and trains at the batch asked.

Writes compile_backoff.json.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import replace

import torch

from _common import add_images_flag, default_job, save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.machine import hardware
from raytune_loader.measuring.measure import run_trial
from raytune_loader.outputs.console import freeze_at_exit

RECOMPILING = "Recompiling function"


class Recompiles(logging.Handler):
    """Dynamo's recompile records (its ``recompiles`` log), kept as their first lines
    and the guard that failed."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith(RECOMPILING):
            lines = [line.strip() for line in text.splitlines()]
            self.reasons.append(" ".join([lines[0], *lines[2:3]]))


def config(batch: int, cpus: int, cuda: bool) -> LoaderConfig:
    """The rule of thumb: min(cpus, 8) workers, prefetch 2, pinned on CUDA, persistent."""
    workers = min(cpus, 8)
    return LoaderConfig(batch, workers, 2, cuda, True)


def main() -> None:
    freeze_at_exit()  # a stage of gpu_check.sh: it exits as quickly as the command lines
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=512, help="what cannot fit")
    parser.add_argument("--gpu-memory-gib", type=float, default=4.0, help="the cap on CUDA")
    parser.add_argument("--steps", type=int, default=16, help="measured steps")
    parser.add_argument("--model", help="default: the device's (resnet50, or small-cnn)")
    add_images_flag(parser)
    args = parser.parse_args()
    job = default_job(steps=args.steps, largest_batch=args.batch_size, images=args.synthetic_images)
    job = replace(job, model=args.model or job.model)
    cuda = job.device == "cuda"
    share = 1.0
    if cuda:
        total = torch.cuda.get_device_properties(0).total_memory
        share = min(1.0, args.gpu_memory_gib * 2**30 / total)
    job = replace(job, compile=True, gpu_memory_share=share)
    recompiles = Recompiles()
    torch._logging.set_logs(recompiles=True)
    logging.getLogger("torch._dynamo").addHandler(recompiles)  # the log's records stop there
    started = time.perf_counter()
    loader = config(args.batch_size, hardware.usable_cpus(), cuda)
    outcome = run_trial(job, loader)
    wall = time.perf_counter() - started
    metrics = outcome.metrics
    for reason in recompiles.reasons:
        print(f"recompiled: {reason}", flush=True)
    save(
        "compile_backoff",
        {
            "device": job.device,
            "model": job.model,
            "gpu_memory_share": share,
            "config": loader.kwargs(),
            "batch_size_asked": args.batch_size,
            "batch_size_trained": outcome.effective_batch_size,
            "oom_backoffs": outcome.oom_backoffs,
            "recompiles": len(recompiles.reasons),
            "recompile_reasons": recompiles.reasons,
            "first_batch_s": metrics.first_batch_s if metrics else None,
            "samples_per_s": metrics.samples_per_s if metrics else None,
            "steady": metrics.steady if metrics else None,
            "trial_wall_s": wall,
            "failure": outcome.failure,
            "detail": outcome.detail,
        },
    )
    if outcome.failure:
        raise SystemExit(f"error: the compiled trial failed ({outcome.failure}: {outcome.detail})")


if __name__ == "__main__":
    main()
