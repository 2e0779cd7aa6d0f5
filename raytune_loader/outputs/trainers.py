"""The trainers whose way of using the tuned loader this release checks.

``tests/test_trainers.py`` trains with the tuned loader, the README's way, in each of
these (two ranks, worker processes and thread workers), and checks that each rank
reads its own shard of every epoch with the tuned settings; with a tuned stream
(webdataset, Parquet; workers started by fork, spawn or forkserver, or threads; ranks
also started by ``torch.multiprocessing.spawn``), that every rank reads as many
batches as every other, disjoint samples, another order each epoch. It also checks
that the installed versions are the ones named here, so this list stays what was
really tried; ``best_config.json`` carries it in its ``trainers`` section.
"""

from __future__ import annotations

from typing import Any

CHECKED = {  # distribution name: release series checked
    "lightning": "2.6",  # Trainer(strategy="ddp"), train_dataloader + on_after_batch_transfer
    "accelerate": "1.15",  # Accelerator.prepare(model, optimizer, loader)
    "ray": "2.60",  # Ray Train: TorchTrainer + ray.train.torch.prepare_data_loader
    "torch": "2.14",  # a DDP loop under torchrun or torch.multiprocessing.spawn
}


def section() -> dict[str, Any]:
    """``best_config.json``'s ``trainers`` section."""
    return {
        "checked": {
            "lightning": CHECKED["lightning"],
            "accelerate": CHECKED["accelerate"],
            "ray_train": CHECKED["ray"],
            "torchrun_ddp": CHECKED["torch"],
        },
        "usage": "each rank reads its own shard of every epoch, a stream as many batches "
        "on every rank: see docs/trainers.md and docs/streams.md",
    }
