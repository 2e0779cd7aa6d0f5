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
    in one call: on CUDA, one batched nvJPEG decode. Running out of device memory raises
    ``torch.cuda.OutOfMemoryError``, whatever the decoder made of it."""
    name, decode_jpeg, _ = _backend()
    if device.type != "cuda":
        return _out_of_memory_kept(decode_jpeg, encoded, mode=_rgb(name), device=device)
    # The decoder allocates its outputs on the current stream and writes them on a stream
    # of its own, after waiting for nothing on ours: memory our stream freed but still
    # reads (the last step's tensors) could be handed to it and overwritten while in
    # use. Decoding under a stream of our own keeps its outputs out of the training
    # stream's freed memory; the training stream then waits for the decode, and the
    # allocator learns that the training stream uses the outputs.
    training = torch.cuda.current_stream(device)
    side = _decode_stream(device)
    with torch.cuda.stream(side):
        images = _out_of_memory_kept(decode_jpeg, encoded, mode=_rgb(name), device=device)
    training.wait_stream(side)
    for image in images:
        image.record_stream(training)
    return images


@functools.lru_cache(maxsize=8)
def _decode_stream(device: torch.device) -> Any:
    return torch.cuda.Stream(device)


def _out_of_memory_kept(decode: Any, *args: Any, **kwargs: Any) -> Any:
    """``decode(...)``, with an out-of-memory error raised as one. torchvision's batched
    CUDA decoder re-raises every error of the decode, out-of-memory included, as a
    plain RuntimeError ("Error while decoding JPEG images: CUDA out of memory..."): its
    text is all that is left of the type, so the text is what is read, here only."""
    try:
        return decode(*args, **kwargs)
    except torch.cuda.OutOfMemoryError:
        raise
    except RuntimeError as exc:
        if "out of memory" in str(exc).lower():
            raise torch.cuda.OutOfMemoryError(str(exc)) from exc
        raise


def decode_one(encoded: torch.Tensor) -> torch.Tensor:
    """One image file's bytes (JPEG, PNG, GIF, WebP) to an RGB uint8 (3, H, W) tensor."""
    name, _, decode_image = _backend()
    return decode_image(encoded, mode=_rgb(name))


def _rgb(name: str) -> Any:
    if name == "torchcodec":
        return "RGB"
    from torchvision.io import ImageReadMode

    return ImageReadMode.RGB
