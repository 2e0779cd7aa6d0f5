"""Datasets for the tests, used through ``--dataset datasets_for_tests:NAME``."""

from __future__ import annotations

import os
import time

import torch
from torch.utils.data import Dataset


class TensorImages(Dataset):
    """Small random images with labels; ``delay_s`` of sleep per sample imitates costly decoding."""

    classes = list(range(10))

    def __init__(self, length: int = 256, size: int = 32, delay_s: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(length, 3, size, size, generator=generator)
        self.labels = torch.randint(0, 10, (length,), generator=generator)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.images[index], self.labels[index]


class Broken(TensorImages):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError(f"sample {index} is broken")


def fast() -> Dataset:
    return TensorImages()


def slow(data_root: str | None = None) -> Dataset:
    return TensorImages(delay_s=0.004)


def broken() -> Dataset:
    return Broken()


def not_a_dataset() -> object:
    return 42


class _DiesInWorker(TensorImages):
    """Kills the DataLoader worker process that loads it, as the OOM killer would."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        import os
        import signal

        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


class _HangsInWorker(TensorImages):
    """Never returns from a worker: a stalled network filesystem."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            time.sleep(3600)
        return super().__getitem__(index)


def dies_in_worker() -> Dataset:
    return _DiesInWorker()


def hangs_in_worker() -> Dataset:
    return _HangsInWorker()


class _DictSamples(TensorImages):
    def __getitem__(self, index: int) -> dict:  # type: ignore[override]
        image, label = super().__getitem__(index)
        return {"image": image, "label": label}


def dict_samples() -> Dataset:
    return _DictSamples()


class ReaderPids(TensorImages):
    """Appends the reading process's id to ``log`` for every sample."""

    def __init__(self, log: str, length: int = 16) -> None:
        super().__init__(length)
        self.log = log

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        with open(self.log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        return super().__getitem__(index)


def linear_model(num_classes: int = 10) -> torch.nn.Module:
    """A model factory that takes ``num_classes=``."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))


def not_a_model() -> object:
    return "a string"
