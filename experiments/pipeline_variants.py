"""Every pipeline variant that runs on a CPU against today's best DataLoader-only one.

    python experiments/pipeline_variants.py [--rounds 3]

On synthetic-imagenet with the default job: the DataLoader configuration of the
last search (2 workers, prefetch 2, persistent) with PIL decoding and the images
normalized in the workers (float32, the pipeline before the search widened), then
each stage changed: uint8 transfer finished on the device, out-of-order batches,
the forkserver and spawn start methods, decoding to tensors (TorchCodec and
transforms.v2), thread workers (torchdata.nodes), and decoding on the device,
which on a CPU machine means in the training process (the search offers it only
with CUDA). Each is trained in rotated rounds, and its input pipeline is also run
alone, without the model; the decode-and-augment rate of one core is measured for
each worker-side variant. Writes results/benchmarks/pipeline_variants.json. There
is no target on two cores: report what is true.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from _common import decode_rate, default_job, save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.measure import measure_input, run_trial
from raytune_loader.pipeline import decoders
from raytune_loader.verdict.selection import rotated

BASE = LoaderConfig(32, 2, 2, False, True)
THREADS = replace(BASE, workers="thread", persistent_workers=False)
VARIANTS = {
    "float32 (today)": BASE,
    "uint8 transfer": replace(BASE, transfer="uint8"),
    "uint8, out of order": replace(BASE, transfer="uint8", in_order=False),
    "uint8, forkserver": replace(BASE, transfer="uint8", multiprocessing_context="forkserver"),
    "uint8, spawn": replace(BASE, transfer="uint8", multiprocessing_context="spawn"),
    "tensor decode": replace(BASE, decode="tensor"),
    "tensor decode, uint8": replace(BASE, decode="tensor", transfer="uint8"),
    "threads": THREADS,
    "threads, tensor decode, uint8": replace(THREADS, decode="tensor", transfer="uint8"),
    "decode in the main process": replace(BASE, decode="device", transfer="uint8"),
}
PER_CORE = [("float32", "pil"), ("uint8", "pil"), ("float32", "tensor"), ("uint8", "tensor")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    job = default_job()
    speeds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    alone: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for repeat, name in rotated(list(VARIANTS), args.rounds):
        outcome = run_trial(job, VARIANTS[name])
        assert outcome.metrics is not None, outcome.detail
        speeds[name].append(outcome.metrics.samples_per_s)
        alone[name].append(measure_input(job, VARIANTS[name]).samples_per_s)
        print(f"round {repeat + 1}: {name:<30} {speeds[name][-1]:6.1f} samples/s trained, "
              f"{alone[name][-1]:6.1f} alone", flush=True)  # fmt: skip
    medians = {name: statistics.median(values) for name, values in speeds.items()}
    base = medians["float32 (today)"]
    save(
        "pipeline_variants",
        {
            "loader": BASE.kwargs(),
            "samples_per_s": speeds,
            "median": medians,
            "over_float32": {name: value / base for name, value in medians.items()},
            "input_alone_samples_per_s": {n: statistics.median(v) for n, v in alone.items()},
            "pipelines": {name: config.pipeline() for name, config in VARIANTS.items()},
            "decode_augment_per_core": {
                f"{decode}, {transfer}": decode_rate(job, 192, transfer, decode)
                for transfer, decode in PER_CORE
            },
            "decoder": decoders.backend(),
            "device": job.device,
        },
    )


if __name__ == "__main__":
    main()
