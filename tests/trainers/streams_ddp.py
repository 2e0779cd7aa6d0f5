"""A DDP loop over tuned streams, the README's way, in ranks started two ways:

- ``torchrun`` (``RANK`` and ``WORLD_SIZE`` in the environment): accelerate's
  ``Accelerator`` makes the process group, and an ``accel`` case goes through
  ``accelerator.prepare`` (which passes the stream loader through);
- ``spawn`` (``torch.multiprocessing.spawn`` and ``init_process_group`` over TCP, with
  nothing in the environment), as a notebook or a hand-written launcher starts ranks.

``streams_ddp.py MODE OUT DATA CASE...`` (cases: streams_common.py).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from streams_common import (
    EPOCHS,
    Record,
    model,
    options,
    overrides,
    train_step,
    write_config,
)

from common import end_ddp_rank
from raytune_loader import load_best_config


def run_case(out: Path, data: Path, case: str, accelerator: object | None) -> None:
    record = Record(case)
    tuned = load_best_config(write_config(out, data, case))
    loader = tuned.dataloader(tuned.dataset(), **overrides(case))
    if "accel" in options(case):  # model, optimizer and the stream loader, prepared
        plain = model()
        optimizer = torch.optim.SGD(plain.parameters(), lr=0.1)
        net, optimizer, prepared = accelerator.prepare(plain, optimizer, loader)  # type: ignore[attr-defined]
        record.extra["prepared_is_the_loader"] = prepared is loader
        loader = prepared
    else:
        net = torch.nn.parallel.DistributedDataParallel(model())
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    record.extra["len"] = len(loader)
    for epoch in range(EPOCHS):
        if "noepoch" not in options(case):
            loader.sampler.set_epoch(epoch)
        if "peek" in options(case) and dist.get_rank() == 0:
            next(iter(loader))  # a batch logged before the epoch, on one rank
        for batch in loader:
            images, labels = tuned.to_device(batch, "cpu")
            record.batch(epoch, labels)
            train_step(net, optimizer, images, labels)
    if "resume" in options(case):
        record.extra["resume"] = resumed(tuned)
    record.gathered(out)


def resumed(tuned: object) -> dict[str, list[int]]:
    """Epoch 2 read two batches far, its state saved, then finished by a new loader
    from that state (a run restarted from a checkpoint)."""
    first = tuned.dataloader(tuned.dataset())  # type: ignore[attr-defined]
    first.sampler.set_epoch(2)
    batches = iter(first)
    before = [int(x) for _ in range(2) for x in next(batches)[1]]
    state = first.state_dict()
    del batches
    again = tuned.dataloader(tuned.dataset())  # type: ignore[attr-defined]
    again.load_state_dict(state)
    again.sampler.set_epoch(2)
    after = [int(x) for batch in again for x in batch[1]]
    return {"before": before, "after": after, "state": state["batches"]}


def ranked(rank: int, port: int, out: Path, data: Path, cases: list[str]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=dt.timedelta(seconds=60))  # fmt: skip
    try:
        for case in cases:
            run_case(out, data, case, None)
    except BaseException:
        dist.destroy_process_group()
        raise
    end_ddp_rank()


def main() -> None:
    mode, out, data, cases = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
    if mode == "torchrun":
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)  # the process group, from torchrun's environment
        for case in cases:
            run_case(out, data, case, accelerator)
        accelerator.end_training()
        return
    if "RANK" in os.environ:
        raise SystemExit("spawn mode starts ranks with nothing in the environment")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torch.multiprocessing.spawn(ranked, args=(port, out, data, cases), nprocs=2)


if __name__ == "__main__":
    main()
