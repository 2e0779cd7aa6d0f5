"""The plain DDP loop under torchrun, as the README shows it."""

from __future__ import annotations

import torch
import torch.distributed as dist

from common import EPOCHS, Record, Recorded, args, end_ddp_rank, model
from raytune_loader import load_best_config


def main() -> None:
    out, images, kinds = args()
    dist.init_process_group("gloo")
    for kind in kinds:
        record = Record(kind, dist.get_rank())
        tuned = load_best_config(out / f"best_config_{kind}.json")
        dataset = Recorded(tuned.image_dataset(images))
        loader = tuned.dataloader(dataset)  # in a process group: this rank's shard
        ddp = torch.nn.parallel.DistributedDataParallel(model())
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        record.saw(loader)
        for epoch in range(EPOCHS):
            loader.sampler.set_epoch(epoch)
            for batch in loader:
                batch = tuned.to_device(batch, "cpu")
                record.batch(epoch, batch)
                loss = torch.nn.functional.cross_entropy(ddp(batch[0]), batch[1])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        record.dump(out)
    end_ddp_rank()


if __name__ == "__main__":
    main()
