"""The input pipeline's stages on either side of the DataLoader.

A candidate's ``transfer`` says where images become normalized float32:
``float32`` in the loader's workers (torchvision's usual ImageNet transforms), or
``uint8`` on the device, after the transfer, as timm's ``PrefetchLoader`` and
Composer do (a quarter of the bytes through shared memory, the pinning thread
and the PCIe link). Its ``decode`` says where JPEGs are decoded: in the workers
(:func:`raytune_loader.pipeline.transforms.imagenet_train_transform`), or ``device``: the
workers only read the files, and :func:`decode_on_device` decodes a whole batch
with :func:`raytune_loader.pipeline.decoders.decode_batch` (nvJPEG on CUDA), then crops
and flips every image there with ``torchvision.transforms.v2``.

:func:`to_device` is the device side, used by every measurement and by
``load_best_config(...).to_device(batch, device)`` in the user's training loop.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import default_collate

from raytune_loader.errors import CorruptSampleError, last_line
from raytune_loader.pipeline.transforms import IMAGENET_MEAN, IMAGENET_STD


def move(batch: Any, device: torch.device, non_blocking: bool, channels_last: bool) -> Any:
    """``batch`` with every tensor on ``device``; image batches in channels-last layout."""
    if isinstance(batch, torch.Tensor):
        moved = batch.to(device, non_blocking=non_blocking)
        if channels_last and moved.dim() == 4 and moved.is_floating_point():
            moved = moved.contiguous(memory_format=torch.channels_last)
        return moved
    if isinstance(batch, (list, tuple)):
        items = [move(item, device, non_blocking, channels_last) for item in batch]
        if hasattr(batch, "_fields"):  # a namedtuple keeps its type and field names
            return type(batch)(*items)
        return type(batch)(items) if isinstance(batch, list) else tuple(items)
    if isinstance(batch, dict):
        return {k: move(v, device, non_blocking, channels_last) for k, v in batch.items()}
    return batch


def to_device(
    batch: Any,
    device: torch.device,
    *,
    transfer: str = "float32",
    decode: str = "pil",
    non_blocking: bool = False,
    channels_last: bool = False,
) -> Any:
    """A batch as the loader yields it, on ``device`` with the variant's device-side
    stages done: decoded and augmented there (``decode="device"``), and converted and
    normalized there (``transfer="uint8"``).

    Args:
        batch: a batch of the loader (images and classes, or an ``EncodedBatch``).
        device: the training device.
        transfer: the images' dtype on the way (``float32`` or ``uint8``).
        decode: where the JPEGs were decoded (``pil``, ``tensor``), or ``device``.
        non_blocking: copy asynchronously (from pinned memory).
        channels_last: images in channels-last memory format.

    Returns:
        The batch on ``device``, ready for the model.
    """
    if decode == "device":
        batch = decode_on_device(batch, device)
    moved = move(batch, device, non_blocking, channels_last)
    if transfer == "float32":
        return moved
    return move(finish_on_device(moved, transfer), device, False, channels_last)


@dataclass(frozen=True)
class EncodedBatch:
    """A batch's JPEG files, back to back in one uint8 tensor: one shared-memory block
    and one pinned copy per batch, not one per image.

    Not a tuple, so trainers that move a batch to the device (Lightning, accelerate,
    Ray Train) keep its type; its :meth:`to` leaves the bytes in host memory, where the
    device decoder reads them."""

    data: torch.Tensor  # every file's bytes, concatenated
    lengths: torch.Tensor  # each file's length, in order

    def files(self) -> list[torch.Tensor]:
        """The batch's files, one tensor of bytes each."""
        return list(torch.split(self.data, self.lengths.tolist()))

    def to(self, *args: Any, **kwargs: Any) -> EncodedBatch:
        """Itself: the device side decodes the files from host memory."""
        return self  # decode_on_device reads the files from host memory

    def pin_memory(self, *args: Any) -> EncodedBatch:
        """The files in pinned memory (the DataLoader's pin thread calls it)."""
        return EncodedBatch(self.data.pin_memory(*args), self.lengths)

    def __len__(self) -> int:
        return len(self.lengths)


def collate_encoded(samples: list[Any]) -> list[Any]:
    """Collate (encoded JPEG, target...) samples: the JPEGs, of different lengths, go into
    one :class:`EncodedBatch` for :func:`decode_on_device`; the rest is stacked."""
    encoded = [sample[0] for sample in samples]
    lengths = torch.tensor([len(e) for e in encoded], dtype=torch.int64)
    rest = default_collate([tuple(sample[1:]) for sample in samples])
    return [EncodedBatch(torch.cat(encoded), lengths), *rest]


def decode_on_device(batch: Any, device: torch.device) -> list[Any]:
    """Decode a batch's JPEGs on ``device`` in one call (nvJPEG's batched decoder on
    CUDA), then RandomResizedCrop(224) and a flip per image there: a uint8
    (N, 3, 224, 224) batch on ``device``, as the workers would have made it. A batch
    that fails as a whole is decoded file by file, and a file the device cannot decode
    (a PNG named .JPEG, a CMYK JPEG: ImageNet has both) is decoded on the CPU."""
    from raytune_loader.pipeline.decoders import decode_batch

    encoded, *rest = batch
    files = encoded.files() if isinstance(encoded, EncodedBatch) else list(encoded)
    try:
        images = decode_batch(files, device)
    except torch.cuda.OutOfMemoryError:
        raise  # the batch size is the cause, not a file: the out-of-memory back-off's turn
    except (RuntimeError, ValueError):  # torchvision.io raises the one, TorchCodec the other
        images = [_decode_alone(data, index, device) for index, data in enumerate(files)]
    augment = _augment()
    return [torch.stack([augment(image) for image in images]), *rest]


def _decode_alone(data: torch.Tensor, index: int, device: torch.device) -> torch.Tensor:
    from raytune_loader.pipeline.decoders import decode_batch, decode_one

    try:
        return decode_batch([data], device)[0]
    except torch.cuda.OutOfMemoryError:
        raise
    except (RuntimeError, ValueError):
        pass
    try:
        return decode_one(data).to(device)
    except (RuntimeError, ValueError) as exc:
        raise CorruptSampleError(
            f"image {index} of this batch failed to decode on {device} and on the CPU: "
            f"{last_line(exc)}"
        ) from None


@functools.cache
def _augment() -> Any:
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])


def normalize(images: torch.Tensor) -> torch.Tensor:
    """uint8 image batches (N, 3, H, W) to float32 normalized with ImageNet's statistics,
    the same arithmetic as ToTensor then Normalize in a worker."""
    mean, std = _statistics(images.device)
    # in place on the one new buffer: three fresh batch-sized buffers a step cost a CPU
    # trainer a page fault every 4 KiB where the allocator hands them back to the system
    return images.to(torch.float32, copy=True).div_(255).sub_(mean).div_(std)


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
