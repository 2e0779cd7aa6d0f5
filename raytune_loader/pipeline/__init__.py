"""The input pipeline's stages on either side of the loader, for every variant.

A pipeline variant says where JPEGs are decoded (``decode``) and what crosses to the
device (``transfer``). :mod:`~raytune_loader.pipeline.transforms` is the workers' side
(the ImageNet training transforms, split as the variant says);
:mod:`~raytune_loader.pipeline.device` the device's side
(:func:`~raytune_loader.pipeline.device.to_device`: decode there, convert, normalize);
:mod:`~raytune_loader.pipeline.decoders` decodes JPEGs to tensors on the CPU or, batched,
with nvJPEG. The device side's names are also this room's (``raytune_loader.pipeline``
was that module before 0.2), imported on first use.

May import: the foundations.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    device = importlib.import_module(f"{__name__}.device")
    if name.startswith("__") or not hasattr(device, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(device, name)
