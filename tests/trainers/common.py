"""What the trainer scripts share: a tuned config, the data, and a record of what each
rank read, kept apart from how each trainer is driven (the scripts beside this file).

Each script trains the README's way for its trainer, with two tuned configs: worker
processes decoding on the device (the encoded JPEGs cross the trainer's device move),
and thread workers decoding to tensors. Every sample carries its index and who
produced it (process id and thread), so the test reads what each rank really read.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch.utils.data import Dataset

from raytune_loader.machine.hardware import cpu_and_gpu_summary

CLASSES, BATCH, EPOCHS = 8, 4, 2  # the tests' tiny_imagenet: 96 images, 8 classes
TUNED = {
    "process": {
        "loader": {"batch_size": BATCH, "num_workers": 1, "prefetch_factor": 3,
                   "pin_memory": False, "persistent_workers": True, "in_order": False,
                   "multiprocessing_context": None},
        "pipeline": {"transfer": "uint8", "decode": "device", "workers": "process"},
    },
    "thread": {
        "loader": {"batch_size": BATCH, "num_workers": 2, "prefetch_factor": 3,
                   "pin_memory": False, "persistent_workers": False, "in_order": False,
                   "multiprocessing_context": None},
        "pipeline": {"transfer": "uint8", "decode": "tensor", "workers": "thread"},
    },
}  # fmt: skip
HF = {  # what the Hugging Face Trainer's TrainingArguments can set (tests/trainers/hf_*)
    "loader": {"batch_size": BATCH, "num_workers": 1, "prefetch_factor": 3,
               "pin_memory": False, "persistent_workers": True, "in_order": True,
               "multiprocessing_context": None},
    "pipeline": {"transfer": "float32", "decode": "tensor", "workers": "process"},
}  # fmt: skip
SETTINGS = ("num_workers", "prefetch_factor", "in_order", "persistent_workers")


def write_tuned_config(folder: Path, kind: str, store: dict[str, Any] | None = None) -> Path:
    """A best_config.json with the ``kind`` of loader, tuned on this machine (on the
    object ``store`` described, with 4 requests in flight a worker, where one is given)."""
    path = folder / f"best_config_{kind}.json"
    tuned = json.loads(json.dumps(TUNED.get(kind, HF)))
    source: dict[str, Any] = {"kind": "imagefolder"}
    if store is not None:
        tuned["pipeline"]["fetch_threads"] = 4
        source["store"] = store
    data = {
        "schema_version": 1, "dataset": "imagefolder", "model": "tiny", "objective": "util",
        **tuned, "source": source, "metrics": {}, "baselines": {}, "speedup": {},
        "hardware": cpu_and_gpu_summary(), "search": {}, "created": "now",
    }  # fmt: skip
    path.write_text(json.dumps(data))
    return path


class Recorded(Dataset):
    """``dataset``'s samples with their index and the reader (pid:thread) added."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        reader = f"{os.getpid()}:{threading.current_thread().name}"
        return (*self.dataset[index], index, reader)

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, ...]]:
        """A batch at once, as a wrapper should pass it on: a bucket's dataset fetches
        the batch's objects together (its ``fetch_threads``)."""
        reader = f"{os.getpid()}:{threading.current_thread().name}"
        many = getattr(self.dataset, "__getitems__", None)
        samples = many(indices) if many else [self.dataset[i] for i in indices]
        return [(*sample, i, reader) for sample, i in zip(samples, indices, strict=True)]


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(12, CLASSES)
    )


class Record:
    """What one rank read, epoch by epoch, and what it trained on."""

    def __init__(self, kind: str, rank: int) -> None:
        self.kind, self.rank = kind, rank
        self.epochs: dict[int, list[int]] = {}
        self.readers: set[str] = set()
        self.images: set[str] = set()
        self.loader: dict[str, Any] = {}
        self.trainer_thread = ""

    def batch(self, epoch: int, batch: list[Any]) -> None:
        """A batch after ``tuned.to_device``: images, labels, indices, readers."""
        images, _, indices, readers = batch
        self.trainer_thread = threading.current_thread().name
        self.epochs.setdefault(epoch, []).extend(int(i) for i in indices)
        self.readers.update(readers)
        low, high = float(images.min()), float(images.max())
        self.images.add(f"{images.dtype} {tuple(images.shape[1:])} {low < -0.5 and high < 3}")

    def saw(self, loader: Any) -> None:
        """The loader the trainer iterates, as the trainer holds it."""
        inner = getattr(loader, "_dataloader", loader)  # Ray Train's wrapper
        self.loader = {"type": type(loader).__name__, "inner": type(inner).__name__}
        self.loader.update({name: getattr(loader, name, None) for name in SETTINGS})

    def dump(self, out: Path) -> None:
        data = {
            "kind": self.kind, "rank": self.rank, "pid": os.getpid(),
            "epochs": {str(e): v for e, v in self.epochs.items()},
            "readers": sorted(self.readers), "trainer_thread": self.trainer_thread,
            "images": sorted(self.images),
            "loader": self.loader,
        }  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{self.kind}-rank{self.rank}.json").write_text(json.dumps(data))


def args() -> tuple[Path, str, list[str]]:
    """``script OUT IMAGES [KIND...]``: where the tuned configs are and the records go,
    the image folder (``<class>/<image>``, a local path or an ``s3://`` URL), and which
    kinds of loader to train with."""
    return Path(sys.argv[1]), sys.argv[2], sys.argv[3:] or list(TUNED)


def end_ddp_rank() -> NoReturn:
    """Leave the gloo group and end this rank, every record written.

    Both ranks pass a barrier first: a rank that took the group down while its peer's
    gloo thread still read aborted the peer. DistributedDataParallel keeps the group
    alive past ``destroy_process_group`` (its ``gloo_tcp_loop`` and ``pt_gloo_runloop``
    threads still run after it and a ``gc.collect()``), so the interpreter's exit tore it
    down, its peer perhaps gone, and now and then aborted the rank ("terminate called
    without an active exception", SIGABRT) after every case had passed. The rank's work
    is done: it ends here, without that teardown."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
