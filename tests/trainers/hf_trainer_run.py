"""The Hugging Face Trainer, as docs/trainers.md shows it: the tuned TrainingArguments
(``tuned.training_arguments()``) over the tuned image dataset, samples as the dicts the
Trainer hands its model. One process, or two ranks under torchrun (gloo on the CPU).

    python hf_trainer_run.py OUT IMAGES           # one process
    torchrun --nproc_per_node 2 hf_trainer_run.py OUT IMAGES

Each rank records the DataLoader the Trainer built (its settings), and which samples it
trained on, in which epoch, read by which process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from common import EPOCHS, model
from raytune_loader import load_best_config


class AsDicts(Dataset):
    """The tuned dataset's ``(image, class)`` samples as the Trainer's model takes them,
    with the sample's index and the process that read it."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> dict[str, Any]:
        image, label = self.dataset[index]
        return {"pixel_values": image, "labels": label, "index": index, "reader": os.getpid()}


class Recorded(torch.nn.Module):
    """A tiny classifier that notes each batch it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.net = model()
        self.epoch = 0
        self.epochs: dict[int, list[int]] = {}
        self.readers: set[int] = set()
        self.batch_sizes: set[int] = set()

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor, index: torch.Tensor,
                reader: torch.Tensor) -> dict[str, torch.Tensor]:  # fmt: skip
        self.epochs.setdefault(self.epoch, []).extend(int(i) for i in index)
        self.readers.update(int(r) for r in reader)
        self.batch_sizes.add(len(index))
        logits = self.net(pixel_values)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


class Seen(TrainerCallback):
    """The Trainer's own DataLoader's settings, and the epoch each batch belongs to."""

    def __init__(self, recorded: Recorded) -> None:
        self.recorded = recorded
        self.loader: dict[str, Any] = {}

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kw):  # noqa: ANN001, ANN201
        self.recorded.epoch = round(state.epoch or 0)
        names = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
        self.loader = {"type": type(train_dataloader).__name__,
                       **{n: getattr(train_dataloader, n, None) for n in names}}  # fmt: skip


def main() -> None:
    out, images = Path(sys.argv[1]), sys.argv[2]
    tuned = load_best_config(out / "best_config_hf.json")
    recorded = Recorded()
    seen = Seen(recorded)
    args = TrainingArguments(
        output_dir=str(out / "hf"), num_train_epochs=EPOCHS, report_to="none",
        save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True, seed=0,
        **tuned.training_arguments(),
    )  # fmt: skip
    trainer = Trainer(model=recorded, args=args, train_dataset=AsDicts(tuned.image_dataset(images)),
                      callbacks=[seen])  # fmt: skip
    trainer.train()
    rank = args.process_index
    (out / f"hf-rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world": args.world_size, "pid": os.getpid(), "loader": seen.loader,
        "epochs": {str(e): v for e, v in recorded.epochs.items()},
        "readers": sorted(recorded.readers), "batch_sizes": sorted(recorded.batch_sizes),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():  # torn down here, not at interpreter exit
        torch.distributed.destroy_process_group()
