"""Two open questions of measuring on a shared GPU, answered on one.

    python experiments/shared_gpu.py [--steps 15] [--configs 6]

1. Ranking: the search runs two trials at once on one GPU (0.5 each). Does the
   ranking of configurations measured two at a time match the ranking of the same
   configurations measured alone? Each configuration is measured alone, then
   paired with two different partners (both of a pair start together, each capped
   at half the GPU's memory, as two Ray trials are); Kendall's tau compares the
   rankings by samples/s (1: the same order; 0: unrelated).
2. NVML: does the per-process utilization (what a trial reports on a shared GPU)
   leave idle periods out of its average? Alone on the GPU, per-process and
   device-wide utilization should agree; the difference is reported per run.

Writes results/benchmarks/shared_gpu.json (BENCH_DIR=results/gpu on the GPU). It
runs on a CPU too (the same code path, no NVML figures): that is how it is tested.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from _common import add_images_flag, default_job, save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.loaders.loader import use_platform_start_method
from raytune_loader.machine import hardware
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.measure import run_trial
from raytune_loader.measuring.outcomes import TrialOutcome
from raytune_loader.outputs.console import freeze_at_exit


def candidates(cuda: bool, batch: int, count: int) -> dict[str, LoaderConfig]:
    """Configurations far enough apart to rank: workers, transfer and decode."""
    workers = (0, 2, 4, 8) if cuda else (0, 1, 2, 2)
    configs = [
        LoaderConfig(batch, w, 2 if w else None, cuda, w > 0, transfer=t)
        for w, t in itertools.product(workers, ("float32", "uint8"))
    ]
    if cuda:
        configs.append(LoaderConfig(batch, 4, 2, True, True, transfer="uint8", decode="device"))
    chosen = configs[:: max(1, len(configs) // count)][:count]
    return {config.label(): config for config in chosen}


def pairings(names: list[str]) -> list[tuple[str, str]]:
    """The pairs run two at a time, in order: each configuration at an even place with
    the next one, then with the one after that (wrapping around)."""
    return [
        (names[i], names[(i + shift) % len(names)])
        for shift in (1, 2)
        for i in range(0, len(names), 2)
    ]


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two paired lists (ties count as neither)."""
    pairs = list(itertools.combinations(range(len(a)), 2))
    score = sum(
        (a[i] - a[j]) * (b[i] - b[j]) > 0 or -((a[i] - a[j]) * (b[i] - b[j]) < 0) for i, j in pairs
    )
    return score / len(pairs)


def _run(job: TrialJob, config: LoaderConfig) -> TrialOutcome:
    # a spawned pool process: its loaders start their workers as the runs alone do (with
    # spawned workers, 2.5 of 6 pairs finished in 124 s on the H200)
    use_platform_start_method()
    return run_trial(job, config)


def _speed(outcome: TrialOutcome) -> float:
    assert outcome.metrics is not None, outcome.detail
    return outcome.metrics.samples_per_s


def main() -> None:
    freeze_at_exit()  # a stage of gpu_check.sh: it exits as quickly as the command lines
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--configs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=0, help="0: the device's default")
    add_images_flag(parser)
    args = parser.parse_args()
    batch = args.batch_size or (256 if hardware.cuda_available() else 32)
    job = default_job(steps=args.steps, largest_batch=batch, images=args.synthetic_images)
    job = replace(job, gpu_memory_share=1.0)
    configs = candidates(job.device == "cuda", batch, args.configs)
    names = list(configs)
    alone: dict[str, TrialOutcome] = {}
    for name in names:
        alone[name] = run_trial(job, configs[name])
        print(f"alone   {name:<60} {_speed(alone[name]):7.1f} samples/s", flush=True)
    half = replace(job, gpu_memory_share=0.5)
    paired: dict[str, list[float]] = {name: [] for name in names}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=context) as pool:
        for first, second in pairings(names):
            runs = [pool.submit(_run, half, configs[n]) for n in (first, second)]
            for name, run in zip((first, second), runs, strict=True):
                paired[name].append(_speed(run.result()))
                print(f"paired  {name:<60} {paired[name][-1]:7.1f} samples/s", flush=True)
    speeds_alone = [_speed(alone[n]) for n in names]
    speeds_paired = [statistics.median(paired[n]) for n in names]
    # only a per-process reading compares with the device's: the device-wide fallbacks
    # (nvml-device, nvml-device-other-pids) are the device figure itself
    nvml = {
        name: {"process": o.metrics.util, "device": o.metrics.device_util}
        for name, o in alone.items()
        if o.metrics and o.metrics.util_source == "nvml-process" and o.metrics.device_util
    }
    gaps = [v["device"] - v["process"] for v in nvml.values()]
    save(
        "shared_gpu",
        {
            "configs": {
                name: config.kwargs() | config.pipeline() for name, config in configs.items()
            },
            "alone_samples_per_s": dict(zip(names, speeds_alone, strict=True)),
            "paired_samples_per_s": paired,
            "kendall_tau": kendall_tau(speeds_alone, speeds_paired),
            "nvml_alone": nvml,
            "nvml_device_minus_process": statistics.mean(gaps) if gaps else None,
            "device": job.device,
            "steps": args.steps,
        },
    )


if __name__ == "__main__":
    main()
