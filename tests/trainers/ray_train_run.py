"""Ray Train's TorchTrainer with two CPU workers, as the README shows it: the tuned
loader goes through ``ray.train.torch.prepare_data_loader``."""

from __future__ import annotations

import sys
from pathlib import Path

import ray
import ray.train
import ray.train.torch
import torch

from common import EPOCHS, Record, Recorded, args, model
from raytune_loader import load_best_config


def train_func(config: dict) -> None:
    sys.path.insert(0, config["here"])  # the workers import common.py too
    out, images = Path(config["out"]), Path(config["images"])
    rank = ray.train.get_context().get_world_rank()
    for kind in config["kinds"]:
        record = Record(kind, rank)
        tuned = load_best_config(out / f"best_config_{kind}.json")
        dataset = Recorded(tuned.image_dataset(images))
        loader = ray.train.torch.prepare_data_loader(tuned.dataloader(dataset))
        net = ray.train.torch.prepare_model(model())
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        record.saw(loader)
        for epoch in range(EPOCHS):
            loader.sampler.set_epoch(epoch)
            for batch in loader:
                batch = tuned.to_device(batch, ray.train.torch.get_device())
                record.batch(epoch, batch)
                loss = torch.nn.functional.cross_entropy(net(batch[0]), batch[1])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        record.dump(out)


def main() -> None:
    out, images, kinds = args()
    ray.init(address="local", num_cpus=2, include_dashboard=False)  # never a test's cluster
    try:
        trainer = ray.train.torch.TorchTrainer(
            train_func,
            train_loop_config={"out": str(out), "images": str(images), "kinds": kinds,
                               "here": str(Path(__file__).parent)},
            scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=False,
                                                   resources_per_worker={"CPU": 1}),
            run_config=ray.train.RunConfig(storage_path=str(out / "ray"), name="trainers"),
        )  # fmt: skip
        trainer.fit()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
