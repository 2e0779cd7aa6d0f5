"""torchvision's small classification sets: CIFAR-10/100, MNIST, Fashion-MNIST.

Read from ``--data-root`` (or downloaded there with ``--download``) with their usual
training transforms; their images are arrays in memory, so their pipeline is not
searched and nothing is pre-warmed.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from raytune_loader.errors import DatasetError
from raytune_loader.pipeline.transforms import IMAGENET_MEAN, IMAGENET_STD
from raytune_loader.sources.base import Source, Spec


class TorchvisionSet(Source):
    """One of torchvision's small classification sets, read with its own transforms."""

    def __init__(self, name: str, cls: str, grayscale: bool = False) -> None:
        self.names = (name,)
        self.summary = f"torchvision's {cls} (--download fetches it)"
        self.cls = cls
        self.grayscale = grayscale

    def accesses(self, spec: Spec) -> tuple[str, ...]:
        return ("map",)

    def pipeline_searched(self, spec: Spec) -> bool:
        return False  # torchvision's own transforms, on its decoded arrays

    def decoders(self, spec: Spec, cuda: bool) -> tuple[str, ...]:
        return ("pil",)

    def files(self, dataset: Dataset, indices: list[int]) -> list[str]:
        return []  # a few binary files, read whole by torchvision when it loads them

    def ray_data_reads(self, spec: Spec) -> bool:
        return False

    def build(self, spec: Spec, transfer: str = "float32", decode: str = "pil") -> Dataset:
        import torchvision
        from torchvision import transforms as T

        if spec.data_root is None:
            raise DatasetError(
                f"{spec.name} needs --data-root (the folder torchvision stores it in)"
            )
        steps: list[Any] = (
            [T.Grayscale(num_output_channels=3)]
            if self.grayscale
            else [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()]
        )
        steps += [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        cls = getattr(torchvision.datasets, self.cls)
        try:
            return cls(
                spec.data_root, train=True, download=spec.download, transform=T.Compose(steps)
            )
        except (RuntimeError, OSError) as exc:  # missing files, or an offline --download
            raise DatasetError(
                f"{spec.name} not found under {spec.data_root} ({exc}); pass --download to "
                "fetch it (needs internet), or point --data-root at a folder that has it"
            ) from None


SOURCES = (
    TorchvisionSet("cifar10", "CIFAR10"),
    TorchvisionSet("cifar100", "CIFAR100"),
    TorchvisionSet("mnist", "MNIST", grayscale=True),
    TorchvisionSet("fashion-mnist", "FashionMNIST", grayscale=True),
)
