"""The tuned S3 loader against what a user would pick instead: s3torchconnector's
``S3MapDataset`` as its README shows it, with the rule of thumb's workers.

    python experiments/s3_user_pick.py [--images 512] [--rounds 3]

The server is the one of experiments/s3_search.py: moto's S3 behind the tests' proxy,
30 ms to each request's first byte, 100 Mbit/s a request. Both loaders read the same
JPEG objects with the same transforms (PIL, RandomResizedCrop 224 and a flip, float32
normalized), batches of 16, min(CPUs, 8) worker processes, so only how they fetch
differs: ``S3MapDataset`` one object at a time per worker (AWS's CRT client), the
tuned loader a batch's objects 16 at a time per worker (the winner of
``s3_search.json`` at 30 ms). Each round times both loaders alone (no model: the
input's own rate), rotated; writes results/benchmarks/s3_user_pick.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from s3_search import BUCKET, TTFBS, _server, _upload

from _common import save
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.loaders.loader import build_dataloader
from raytune_loader.machine import hardware
from raytune_loader.sources import synthetic
from raytune_loader.sources.datasets import DatasetSpec, build_dataset
from raytune_loader.verdict.selection import rotated

BATCH, WARMUP, BATCHES = 16, 2, 16


def _user_pick(endpoint: str, classes: list[str], workers: int) -> Any:
    """s3torchconnector's README: ``S3MapDataset.from_prefix`` with a transform, in a
    plain DataLoader with the rule of thumb's workers."""
    from PIL import Image
    from s3torchconnector import S3ClientConfig, S3MapDataset
    from torch.utils.data import DataLoader

    from raytune_loader.pipeline.transforms import imagenet_train_transform

    transform = imagenet_train_transform()
    index = {name: i for i, name in enumerate(classes)}

    def sample(obj: Any) -> tuple[Any, int]:
        image = Image.open(obj).convert("RGB")
        return transform(image), index[obj.key.split("/")[-2]]

    dataset = S3MapDataset.from_prefix(
        f"s3://{BUCKET}/imagenet/train/", region="us-east-1", endpoint=endpoint,
        transform=sample, s3client_config=S3ClientConfig(force_path_style=True),
    )  # fmt: skip
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                      persistent_workers=True)  # fmt: skip


def _tuned(workers: int) -> Any:
    """The package's bucket dataset with the search's winner at 30 ms: 16 in flight."""
    dataset = build_dataset(DatasetSpec("imagenet", f"s3://{BUCKET}/imagenet"))
    knobs = {"num_workers": workers, "prefetch_factor": 2, "persistent_workers": True,
             "fetch_threads": 16}  # fmt: skip
    config = LoaderConfig.from_dict(knobs, BATCH)
    return build_dataloader(dataset, config, seed=0)


def _rate(loader: Any) -> float:
    """Samples/s over BATCHES batches after WARMUP (the workers started, pools open)."""
    batches = iter(loader)
    for _ in range(WARMUP):
        next(batches)
    started, samples = time.perf_counter(), 0
    for _ in range(BATCHES):
        samples += len(next(batches)[1])
    return samples / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    workers = min(hardware.usable_cpus(), 8)
    with tempfile.TemporaryDirectory() as tmp, _server([TTFBS[0]]) as (moto, proxy):
        root = synthetic.ensure_synthetic_imagenet(Path(tmp) / "data", args.images, 10, 2)
        _upload(root / "train", moto)
        os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": proxy})  # fmt: skip
        classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
        ways = {"s3torchconnector": lambda: _user_pick(proxy, classes, workers),
                "tuned": lambda: _tuned(workers)}  # fmt: skip
        runs: dict[str, list[float]] = {name: [] for name in ways}
        for repeat, name in rotated(list(ways), args.rounds):
            runs[name].append(_rate(ways[name]()))
            print(f"round {repeat + 1} {name}: {runs[name][-1]:.1f} samples/s", flush=True)
    medians = {name: statistics.median(found) for name, found in runs.items()}
    save("s3_user_pick", {
        "images": args.images, "ttfb_s": TTFBS[0], "batch_size": BATCH, "workers": workers,
        "runs": runs, "medians": medians,
        "tuned_vs_s3torchconnector": medians["tuned"] / medians["s3torchconnector"],
    })  # fmt: skip


if __name__ == "__main__":
    main()
