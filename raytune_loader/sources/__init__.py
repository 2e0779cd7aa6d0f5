"""Data sources: one module per kind of data, one registry.

Each format module defines the :class:`~raytune_loader.sources.base.Source` of one kind
of data (timm's ``readers/`` pattern): the ``--dataset`` names it answers to, how its
data is made ready and built with a pipeline variant's worker side, and what it can do.
:mod:`~raytune_loader.sources.registry` lists them; the rest of the package asks a
source and never branches on a dataset's name. :mod:`~raytune_loader.sources.datasets`
turns a ``--dataset`` name into the dataset a measurement reads;
:mod:`~raytune_loader.sources.synthetic` writes the embedded default dataset (it imports
no torch: this face imports its names only on first use). A new data format is one
module here and one line in the registry.

May import: the foundations, ``machine``, ``pipeline``, ``loaders``, ``stores``.
"""

from __future__ import annotations

import importlib
from typing import Any

_FACE = {name: "registry" for name in ("DEFAULT", "REGISTRY", "help_text", "names", "source_for")}
_FACE["Source"] = "base"


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_FACE[name]}"), name)


__all__ = sorted(_FACE)
