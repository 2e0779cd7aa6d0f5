"""Do the pipeline variants give the same training images? Measured on this device.

    python experiments/decoders_agree.py [--samples 32]

For each sample of the embedded dataset, the same random draws (crop box, flip)
go through every variant the search may choose here: PIL in the workers (the
reference), tensors in the workers, and, on a CUDA machine, nvJPEG on the GPU
(on a CPU machine: the same call decoding on the CPU). Reports, in levels of 255,
the largest difference and the share of values that differ. Writes
results/benchmarks/decoders_agree.json (BENCH_DIR=results/gpu on the GPU).
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import default_collate

from _common import add_images_flag, default_job, save
from raytune_loader import datasets, decoders
from raytune_loader.pipeline import collate_encoded, to_device
from raytune_loader.transforms import IMAGENET_STD

VARIANTS = [("tensor", "float32"), ("tensor", "uint8"), ("device", "uint8")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=32)
    add_images_flag(parser)
    args = parser.parse_args()
    job = default_job(steps=1, images=args.synthetic_images)
    device = torch.device(job.device)
    level = 1 / 255 / min(IMAGENET_STD)  # one uint8 level after normalization
    reference = datasets.build_dataset(job.dataset, "float32", "pil")
    figures = {}
    for decode, transfer in VARIANTS:
        variant = datasets.build_dataset(job.dataset, transfer, decode)
        collate = collate_encoded if decode == "device" else default_collate
        largest, differing, total = 0.0, 0, 0
        for index in range(args.samples):
            torch.manual_seed(index)
            expected, _ = reference[index]
            torch.manual_seed(index)
            batch = collate([variant[index]])
            images, _ = to_device(batch, device, transfer=transfer, decode=decode)
            levels = (images[0].cpu() - expected).abs() / level
            largest = max(largest, float(levels.max()))
            differing += int((levels > 0.01).sum())
            total += levels.numel()
        figures[f"{decode}, {transfer}"] = {
            "max_levels": round(largest, 2),
            "share_differing": differing / total,
        }
        print(f"{decode:>6}, {transfer:<7} max {largest:5.2f} levels, "
              f"{differing / total:.2%} of values differ", flush=True)  # fmt: skip
    save("decoders_agree", {"against": "pil, float32", "variants": figures,
                            "decoder": decoders.backend(), "device": job.device})  # fmt: skip


if __name__ == "__main__":
    main()
