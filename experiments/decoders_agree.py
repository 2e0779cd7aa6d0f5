"""Do the pipeline variants give the same training images? Measured on this device.

    python experiments/decoders_agree.py [--samples 32]

For each sample of the embedded dataset, the same random draws (crop box, flip)
go through every variant the search may choose here: PIL in the workers (the
reference), tensors in the workers, and, on a CUDA machine, nvJPEG on the GPU
(on a CPU machine: the same call decoding on the CPU). Reports, in levels of 255,
the largest difference and the share of values that differ. On CUDA it also
times a batch's nvJPEG decode through raytune_loader.pipeline.decoders.decode_batch (on a
stream of its own, the training stream waiting for it: the guard against the
decoder writing into memory the training stream freed but still reads) against
the decoder called bare: what the guard costs. Writes
results/benchmarks/decoders_agree.json (BENCH_DIR=results/gpu on the GPU).
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import default_collate

from _common import add_images_flag, default_job, save
from raytune_loader.outputs.console import freeze_at_exit
from raytune_loader.pipeline import decoders
from raytune_loader.pipeline.device import collate_encoded, to_device
from raytune_loader.pipeline.transforms import IMAGENET_STD
from raytune_loader.sources import datasets

VARIANTS = [("tensor", "float32"), ("tensor", "uint8"), ("device", "uint8")]


def main() -> None:
    freeze_at_exit()  # a stage of gpu_check.sh: it exits as quickly as the command lines
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
    guard = _guard_cost(job, args.samples) if device.type == "cuda" else None
    save("decoders_agree", {"against": "pil, float32", "variants": figures,
                            "decoder": decoders.backend(), "device": job.device,
                            "stream_guard": guard})  # fmt: skip


def _guard_cost(job, samples: int) -> dict:  # noqa: ANN001
    """Milliseconds per batch of ``samples`` JPEGs: guarded decode_batch vs the bare call."""
    import time

    device = torch.device(job.device)
    variant = datasets.build_dataset(job.dataset, "uint8", "device")
    files = [variant[i][0] for i in range(samples)]
    _, bare_decode, _ = decoders._backend()  # noqa: SLF001 - the call the guard wraps
    mode = decoders._rgb(decoders.backend())  # noqa: SLF001

    def timed(decode) -> float:  # noqa: ANN001
        decode()  # warm: nvJPEG's handles, the allocator
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(10):
            decode()
        torch.cuda.synchronize(device)
        return (time.perf_counter() - started) / 10 * 1000

    guarded = timed(lambda: decoders.decode_batch(files, device))
    bare = timed(lambda: bare_decode(files, mode=mode, device=device))
    print(f"nvJPEG, {samples} files: {guarded:.2f} ms guarded, {bare:.2f} ms bare", flush=True)
    return {"batch": samples, "guarded_ms": guarded, "bare_ms": bare, "ratio": guarded / bare}


if __name__ == "__main__":
    main()
