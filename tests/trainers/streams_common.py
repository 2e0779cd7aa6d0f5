"""What the stream trainer scripts share: a case (a tuned stream config), the data,
and a record of what each rank read, all-gathered, kept apart from how each trainer is
driven (the ``streams_*.py`` scripts beside this file).

A case is ``FORMAT-WORKERS[-START][-OPTIONS]``: ``wds`` (webdataset shards) or ``pq``
(Parquet files through ``--dataset hf``), ``process`` or ``thread`` workers, the start
method of process workers (``fork``, ``spawn``, ``forkserver``), and options:
``persist`` (persistent workers), ``inworkers`` (batches made by the stream in each
worker), ``droplast``, ``noepoch`` (nobody calls ``set_epoch``: the loader advances by
itself), ``peek`` (rank 0 reads one batch after ``set_epoch``, before the epoch, as a
logging line would), ``resume`` (a third epoch read half, saved, and finished by a new
loader from the saved state). A sample's class is its index in the data, so a batch's
labels say which samples a rank read.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from raytune_loader.machine.hardware import cpu_and_gpu_summary

BATCH, EPOCHS, SAMPLES = 4, 2, 44  # conftest.UNEVEN: shards of 20, 20 and 4


def write_config(out: Path, data: Path, case: str) -> Path:
    """A best_config.json of a tuned stream for ``case``, tuned on this machine."""
    fmt, workers, *rest = case.split("-")
    start = next((r for r in rest if r in ("fork", "spawn", "forkserver")), None)
    name, root = ("webdataset", data / "wds") if fmt == "wds" else ("hf", data / "parquet")
    loader = {
        "batch_size": BATCH,
        "num_workers": 2,
        "prefetch_factor": 2,
        "in_order": False,
        "persistent_workers": "persist" in rest,
        "multiprocessing_context": start,
    }
    best = {
        "schema_version": 1, "dataset": name, "model": "tiny", "objective": "util",
        "metrics": {}, "baselines": {}, "speedup": {}, "hardware": cpu_and_gpu_summary(),
        "created": "", "loader": loader,
        "pipeline": {"transfer": "uint8", "decode": "tensor", "workers": workers,
                     "access": "stream",
                     "batching": "workers" if "inworkers" in rest else "loader"},
        "source": {"kind": name, "shuffle_buffer": 8},
        "search": {"dataset_spec": {"name": name, "data_root": str(root)}},
    }  # fmt: skip
    path = out / f"best_config_{case}.json"
    partial = path.with_suffix(f".{os.getpid()}")  # every rank writes it: whole, or not
    partial.write_text(json.dumps(best))
    os.replace(partial, path)
    return path


def options(case: str) -> set[str]:
    return set(case.split("-")[2:])


def overrides(case: str) -> dict[str, Any]:
    return {"drop_last": True} if "droplast" in options(case) else {}


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(12, SAMPLES)
    )


class Record:
    """What one rank read of one case, epoch by epoch."""

    def __init__(self, case: str) -> None:
        self.case = case
        self.epochs: dict[int, list[list[int]]] = {}  # epoch: its batches' labels
        self.extra: dict[str, Any] = {}

    def batch(self, epoch: int, labels: Any) -> None:
        self.epochs.setdefault(epoch, []).append([int(x) for x in labels])

    def gathered(self, out: Path) -> None:
        """Every rank's record, all-gathered; rank 0 writes them."""
        mine = {"epochs": {str(e): b for e, b in self.epochs.items()}, **self.extra}
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        if dist.get_rank() == 0:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"streams-{self.case}.json").write_text(json.dumps(every))


def train_step(net: Any, optimizer: Any, images: torch.Tensor, labels: torch.Tensor) -> None:
    """One DDP step: its gradients' all-reduce waits for every rank's, so ranks that
    read different numbers of batches would hang or fail here."""
    loss = torch.nn.functional.cross_entropy(net(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def args() -> tuple[Path, Path, list[str]]:
    """``script OUT DATA CASE...``: where configs and records go, the data, the cases."""
    return Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
