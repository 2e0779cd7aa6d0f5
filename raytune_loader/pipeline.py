"""The input pipeline's stages on either side of the DataLoader.

A candidate's ``transfer`` says where images become normalized float32:
``float32`` in the loader's workers (torchvision's usual ImageNet transforms), or
``uint8`` on the device, after the transfer, as timm's ``PrefetchLoader`` and
Composer do (a quarter of the bytes through shared memory, the pinning thread
and the PCIe link). The worker side is
:func:`raytune_loader.datasets.imagenet_train_transform`; :func:`finish_on_device`
is the device side, used by every measurement and by ``load_best_config(...)
.to_device(batch, device)`` in the user's training loop.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from raytune_loader.datasets import IMAGENET_MEAN, IMAGENET_STD


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 image batches (N, 3, H, W) to float32 normalized with ImageNet's statistics,
    the same arithmetic as ToTensor then Normalize in a worker."""
    mean, std = _statistics(images.device)
    return (images.float().div_(255) - mean) / std


@functools.lru_cache(maxsize=8)
def _statistics(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std on ``device``, made once: this runs in every measured step, where
    two small host-to-device copies per batch would be work the training loop does not do."""
    mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)
    return mean, std


def finish_on_device(batch: Any, transfer: str) -> Any:
    """The device-side stages of ``transfer`` on a batch already on the device: with
    ``uint8``, the images (the first element of an (input, target) batch, or any uint8
    4-D tensor of a dict batch) are converted and normalized; otherwise unchanged."""
    if transfer != "uint8":
        return batch
    if isinstance(batch, (list, tuple)) and batch and _is_images(batch[0]):
        return type(batch)([normalize(batch[0]), *batch[1:]])
    if isinstance(batch, dict):
        return {k: normalize(v) if _is_images(v) else v for k, v in batch.items()}
    return batch


def _is_images(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 4
