"""The ImageNet training transforms, as each pipeline variant splits them.

RandomResizedCrop(224) and a horizontal flip, then conversion and ImageNet
normalization. Where the variant says, the worker side stops early: at the uint8
tensor (``transfer="uint8"``: :func:`raytune_loader.pipeline.device.finish_on_device`
normalizes on the device), or before decoding (``decode="device"``:
:func:`raytune_loader.pipeline.device.decode_on_device` does it all there).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import Any

from raytune_loader.errors import CorruptSampleError, last_line

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def imagenet_train_transform(
    transfer: str = "float32", decode: str = "pil"
) -> Callable[[Any], Any] | None:
    """The worker side of a pipeline variant. ``float32`` converts and normalizes
    (3 x 224 x 224 x 4 bytes a sample cross shared memory and the PCIe link), ``uint8``
    stops at the uint8 tensor (a quarter of the bytes). ``decode="pil"`` crops PIL
    images (torchvision's classic transforms); ``"tensor"`` crops the uint8 tensor
    :mod:`raytune_loader.pipeline.decoders` made (``transforms.v2``); ``"device"`` has no
    worker-side transform: the encoded bytes cross."""
    if decode == "device":
        return None
    if decode == "tensor":
        import torch
        from torchvision.transforms import v2

        steps = [v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()]
        if transfer == "uint8":
            return v2.Compose(steps)
        scale = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        return v2.Compose([*steps, *scale])
    from torchvision import transforms as T

    crop = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    if transfer == "uint8":
        return T.Compose([*crop, T.PILToTensor()])
    return T.Compose([*crop, T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


_kept_transform = functools.cache(imagenet_train_transform)  # stateless: one per variant


def worker_image(data: bytes, transfer: str = "float32", decode: str = "pil") -> Any:
    """An encoded image (a file's bytes, a tar member, a table's cell) as the worker side
    of a pipeline variant makes it: the bytes as a 1-D uint8 tensor for
    ``decode="device"``, otherwise decoded (PIL, or :mod:`raytune_loader.pipeline.decoders` to a
    tensor) and transformed. Bytes that do not decode raise CorruptSampleError with
    the decoder's reason; the caller names the sample."""
    import torch

    if not data:
        raise CorruptSampleError("no image bytes")
    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if decode == "device":
        return encoded
    try:
        if decode == "tensor":
            from raytune_loader.pipeline.decoders import decode_one

            image: Any = decode_one(encoded)
        else:
            from PIL import Image

            image = Image.open(io.BytesIO(data)).convert("RGB")
    except (OSError, RuntimeError, ValueError) as exc:
        raise CorruptSampleError(last_line(exc)) from None
    transform = _kept_transform(transfer, decode)
    return transform(image) if transform else image
