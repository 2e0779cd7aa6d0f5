"""accelerate under torchrun, as the README shows it: the tuned loader goes through
``accelerator.prepare`` with the model and the optimizer."""

from __future__ import annotations

import torch
from accelerate import Accelerator

from common import EPOCHS, Record, Recorded, args, model
from raytune_loader import load_best_config


def main() -> None:
    out, images, kinds = args()
    accelerator = Accelerator(cpu=True)
    for kind in kinds:
        record = Record(kind, accelerator.process_index)
        tuned = load_best_config(out / f"best_config_{kind}.json")
        dataset = Recorded(tuned.image_dataset(images))
        net = model()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        net, optimizer, loader = accelerator.prepare(net, optimizer, tuned.dataloader(dataset))
        record.saw(loader)
        for epoch in range(EPOCHS):
            for batch in loader:
                batch = tuned.to_device(batch, accelerator.device)
                record.batch(epoch, batch)
                loss = torch.nn.functional.cross_entropy(net(batch[0]), batch[1])
                optimizer.zero_grad()
                accelerator.backward(loss)
                optimizer.step()
        record.dump(out)
    accelerator.end_training()


if __name__ == "__main__":
    main()
