"""Lightning's Trainer with strategy="ddp" on two CPU devices, as the README shows it:
``train_dataloader`` returns the tuned loader, ``on_after_batch_transfer`` finishes the
batch on the device. Each kind of loader in a Trainer of its own, one after the other in
one launch: Lightning starts the second rank once, and both fit in one process group."""

from __future__ import annotations

import lightning as L
import torch

from common import EPOCHS, Record, Recorded, args, model
from raytune_loader import load_best_config


class Classifier(L.LightningModule):
    def __init__(self, config: str, images: str, record: Record) -> None:
        super().__init__()
        self.tuned = load_best_config(config)
        self.images = images
        self.net = model()
        self.record = record

    def train_dataloader(self):  # noqa: ANN201
        return self.tuned.dataloader(Recorded(self.tuned.image_dataset(self.images)))

    def on_after_batch_transfer(self, batch, dataloader_idx):  # noqa: ANN001, ANN201
        return self.tuned.to_device(batch, self.device)

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        if batch_idx == 0:
            self.record.saw(self.trainer.train_dataloader)
        self.record.batch(self.current_epoch, batch)
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    out, images, kinds = args()
    for kind in kinds:
        record = Record(kind, rank=-1)
        trainer = L.Trainer(
            accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(Classifier(str(out / f"best_config_{kind}.json"), str(images), record))
        record.rank = trainer.global_rank
        record.dump(out)


if __name__ == "__main__":
    main()
    # Lightning leaves its gloo group alive; torn down at interpreter exit, its C++
    # threads can abort the process ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
