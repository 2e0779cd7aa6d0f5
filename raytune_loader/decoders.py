"""JPEG decoding to tensors, on the CPU or, batched, on a CUDA device (nvJPEG).

TorchCodec is the maintained home of these decoders: torchvision 0.29 deprecated
its own ``torchvision.io`` image decoding in TorchCodec's favour. TorchCodec's
binary follows torch's releases, so where it cannot load (an older torch),
``torchvision.io``'s decoders, which have the same calls, take over.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any

import torch

log = logging.getLogger(__name__)


@functools.cache
def _backend() -> tuple[str, Any, Any]:
    try:
        from torchcodec.decoders import decode_image, decode_jpeg
    except (ImportError, OSError, RuntimeError) as exc:  # not installed, or built for another torch
        log.info("TorchCodec cannot load (%s); decoding with torchvision.io", exc)
        # its deprecation notice, on every call, is ours to give (above), once
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="torchvision.io")
        from torchvision.io import decode_image, decode_jpeg

        return "torchvision.io", decode_jpeg, decode_image
    return "torchcodec", decode_jpeg, decode_image


def backend() -> str:
    """``torchcodec`` or ``torchvision.io``: which library decodes."""
    return _backend()[0]


def decode_batch(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """JPEGs (1-D uint8 tensors on the CPU) to RGB uint8 (3, H, W) tensors on ``device``,
    in one call: on CUDA, one batched nvJPEG decode."""
    name, decode_jpeg, _ = _backend()
    return decode_jpeg(encoded, mode=_rgb(name), device=device)


def decode_one(encoded: torch.Tensor) -> torch.Tensor:
    """One image file's bytes (JPEG, PNG, GIF, WebP) to an RGB uint8 (3, H, W) tensor."""
    name, _, decode_image = _backend()
    return decode_image(encoded, mode=_rgb(name))


def _rgb(name: str) -> Any:
    if name == "torchcodec":
        return "RGB"
    from torchvision.io import ImageReadMode

    return ImageReadMode.RGB
