"""Datasets for the tests, used through ``--dataset datasets_for_tests:NAME``."""

from __future__ import annotations

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
