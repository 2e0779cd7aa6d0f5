"""JPEG decoding to tensors: which library decodes, and that it decodes as PIL does."""

from __future__ import annotations

import io
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from raytune_loader.pipeline import decoders

CPU = torch.device("cpu")


@pytest.fixture(params=["torchcodec", "torchvision.io"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each decoding library in turn: torchvision.io by making TorchCodec unimportable."""
    decoders._backend.cache_clear()
    if request.param == "torchvision.io":
        monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)
    elif decoders.backend() != "torchcodec":
        pytest.skip("TorchCodec cannot load here")
    yield decoders.backend()
    decoders._backend.cache_clear()


def _encoded(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _as_pil_decodes(data: bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(data)) as image:
        return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)


def _recoded(path: Path, mode: str, fmt: str) -> bytes:
    out = io.BytesIO()
    with Image.open(path) as image:
        image.convert(mode).save(out, format=fmt)
    return out.getvalue()


class _BuiltForAnotherTorch(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        raise OSError("libtorchcodec_core.so: undefined symbol")


@pytest.mark.parametrize(
    "broken", [None, _BuiltForAnotherTorch("torchcodec.decoders")], ids=["absent", "unloadable"]
)
def test_torchvision_io_decodes_where_torchcodec_cannot_load(
    broken: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoders._backend.cache_clear()
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", broken)
    try:
        assert decoders.backend() == "torchvision.io"
    finally:
        decoders._backend.cache_clear()


def test_a_batch_of_jpegs_decodes_to_the_pixels_pil_gives(
    backend: str, tiny_imagenet: Path
) -> None:
    files = sorted((tiny_imagenet / "train").rglob("*.JPEG"))[:3]  # three sizes, one portrait
    data = [path.read_bytes() for path in files]
    images = decoders.decode_batch([_encoded(d) for d in data], CPU)
    assert len(images) == 3
    for image, raw in zip(images, data, strict=True):
        expected = _as_pil_decodes(raw)
        assert image.dtype == torch.uint8 and image.device == CPU
        assert image.shape == expected.shape  # (3, H, W), H and W as in the file
        assert (image.int() - expected.int()).abs().float().mean() < 0.5, backend


def test_one_file_decodes_as_in_a_batch_whatever_its_format(
    backend: str, tiny_imagenet: Path
) -> None:
    path = next((tiny_imagenet / "train").rglob("*.JPEG"))
    jpeg = path.read_bytes()
    (in_batch,) = decoders.decode_batch([_encoded(jpeg)], CPU)
    assert torch.equal(decoders.decode_one(_encoded(jpeg)), in_batch)
    png = _recoded(path, "RGBA", "PNG")  # lossless, with an alpha channel to drop
    assert torch.equal(decoders.decode_one(_encoded(png)), _as_pil_decodes(png))


def test_a_grayscale_jpeg_becomes_three_equal_channels(backend: str, tiny_imagenet: Path) -> None:
    gray = _recoded(next((tiny_imagenet / "train").rglob("*.JPEG")), "L", "JPEG")
    for image in (
        decoders.decode_one(_encoded(gray)),
        *decoders.decode_batch([_encoded(gray)], CPU),
    ):
        assert image.shape[0] == 3
        assert torch.equal(image[0], image[1]) and torch.equal(image[1], image[2])
