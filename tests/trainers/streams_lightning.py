"""Lightning's Trainer (strategy="ddp", two CPU devices: Lightning's launcher starts the
second rank, ``RANK`` unset) over tuned streams, as the README shows it:
``train_dataloader`` returns ``tuned.dataloader(tuned.dataset(...))``; Lightning calls
the loader's ``sampler.set_epoch``. One Trainer per case, in one launch.
``streams_lightning.py OUT DATA CASE...`` (cases: streams_common.py)."""

from __future__ import annotations

import lightning as L
import torch
from streams_common import EPOCHS, Record, args, model, overrides, write_config

from raytune_loader import load_best_config


class Classifier(L.LightningModule):
    def __init__(self, config: str, case: str, record: Record) -> None:
        super().__init__()
        self.tuned = load_best_config(config)
        self.case = case
        self.net = model()
        self.record = record

    def train_dataloader(self):  # noqa: ANN201
        return self.tuned.dataloader(self.tuned.dataset(), **overrides(self.case))

    def on_after_batch_transfer(self, batch, dataloader_idx):  # noqa: ANN001, ANN201
        return self.tuned.to_device(batch, self.device)

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        self.record.batch(self.current_epoch, batch[1])
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    out, data, cases = args()
    for case in cases:
        record = Record(case)
        trainer = L.Trainer(
            accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(Classifier(str(write_config(out, data, case)), case, record))
        record.extra["len"] = trainer.num_training_batches
        record.gathered(out)


if __name__ == "__main__":
    main()
    # Lightning leaves its gloo group alive; torn down at interpreter exit, its C++
    # threads can abort the process ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
