"""Ray Train's TorchTrainer with two CPU workers, as the README shows it: the tuned
loader goes through ``ray.train.torch.prepare_data_loader``."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import ray
import ray.train
import ray.train.torch
import torch
from ray.util.state import get_actor

from common import EPOCHS, Record, Recorded, args, model
from raytune_loader import load_best_config


def train_func(config: dict) -> None:
    sys.path.insert(0, config["here"])  # the workers import common.py too
    out, images = Path(config["out"]), config["images"]  # a path, or an s3:// URL
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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@ray.remote(num_cpus=0)
class _Probe:
    """A worker of this instance, as Ray Train's placement-group cleaner is."""

    def own_state(self) -> str | None:
        found = get_actor(ray.get_runtime_context().get_actor_id(), timeout=30)
        return None if found is None else found.state


def fit(train_func: object, config: dict, out: Path, name: str) -> None:
    """``train_func`` on two Ray Train workers of a Ray instance of its own, with
    ``config`` (and ``here``, this folder, for the workers' imports)."""
    # Ray Train's placement-group cleaner asks the state API whether the controller
    # lives, and finds that API from /tmp/ray/ray_current_cluster (the cluster test's
    # head) and that head's dashboard URL (127.0.0.1:8265 even with no dashboard): on a
    # machine where another test's search serves 8265 it heard "no such actor" and
    # removed this run's placement group, killing both ranks. This instance serves its
    # own dashboard, and its workers (started after this line) ask that one.
    port = _free_port()
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
    ray.init(address="local", num_cpus=2, include_dashboard=True,
             dashboard_port=port)  # never a test's cluster  # fmt: skip
    try:
        probe = _Probe.remote()
        seen = ray.get(probe.own_state.remote())
        if seen != "ALIVE":  # Ray Train's cleaner would take its controller for dead
            raise SystemExit(f"a worker's state API sees its own live actor as {seen}")
        ray.kill(probe)
        trainer = ray.train.torch.TorchTrainer(
            train_func,
            train_loop_config={**config, "here": str(Path(__file__).parent)},
            scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=False,
                                                   resources_per_worker={"CPU": 1}),
            run_config=ray.train.RunConfig(storage_path=str(out / "ray"), name=name),
        )  # fmt: skip
        trainer.fit()
    finally:
        ray.shutdown()


def main() -> None:
    out, images, kinds = args()
    fit(train_func, {"out": str(out), "images": str(images), "kinds": kinds}, out, "trainers")


if __name__ == "__main__":
    main()
