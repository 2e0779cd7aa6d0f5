"""Ray Train's TorchTrainer with two CPU workers over tuned streams, as the README shows
it: the loader goes through ``ray.train.torch.prepare_data_loader``, which keeps it
(wrapped to move batches). ``streams_ray.py OUT DATA CASE...``."""

from __future__ import annotations

import sys
from pathlib import Path

import ray.train
import ray.train.torch
import torch
from ray_train_run import fit
from streams_common import EPOCHS, Record, args, model, overrides, train_step, write_config

from raytune_loader import load_best_config


def train_func(config: dict) -> None:
    sys.path.insert(0, config["here"])  # the workers import streams_common.py too
    out, data = Path(config["out"]), Path(config["data"])
    for case in config["cases"]:
        record = Record(case)
        tuned = load_best_config(write_config(out, data, case))
        loader = ray.train.torch.prepare_data_loader(
            tuned.dataloader(tuned.dataset(), **overrides(case))
        )
        net = ray.train.torch.prepare_model(model())
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        record.extra["type"] = type(loader).__name__
        for epoch in range(EPOCHS):
            loader.sampler.set_epoch(epoch)
            for batch in loader:
                images, labels = tuned.to_device(batch, ray.train.torch.get_device())
                record.batch(epoch, labels)
                train_step(net, optimizer, images, labels)
        record.gathered(out)


def main() -> None:
    out, data, cases = args()
    fit(train_func, {"out": str(out), "data": str(data), "cases": cases}, out, "streams")


if __name__ == "__main__":
    main()
