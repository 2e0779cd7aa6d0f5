"""The registry of data sources: every kind of data, in the order names are matched.

:data:`REGISTRY` lists each format module's :class:`~raytune_loader.sources.base.Source`
(timm's ``readers/`` pattern); the command line's help and the unknown-dataset error
list from it. A new data format is a new module with its ``Source`` and one line here.
"""

from __future__ import annotations

from raytune_loader.errors import DatasetError
from raytune_loader.sources import (
    factory,
    hf_tables,
    image_folders,
    torchvision_sets,
    webdataset_shards,
)
from raytune_loader.sources.base import Source

REGISTRY: tuple[Source, ...] = (
    *image_folders.SOURCES,
    *torchvision_sets.SOURCES,
    webdataset_shards.SOURCE,
    hf_tables.SOURCE,
    factory.SOURCE,  # last: it answers to any name with a colon
)
DEFAULT = image_folders.SYNTHETIC.names[0]


def names() -> list[str]:
    """Every ``--dataset`` value the registry answers to, in its order."""
    return [name for source in REGISTRY for name in source.names]


def source_for(name: str) -> Source:
    """The source ``--dataset name`` answers to; a DatasetError listing every name for an
    unknown one."""
    for source in REGISTRY:
        if source.matches(name):
            return source
    raise DatasetError(f"unknown dataset {name!r}: use one of {', '.join(names())}")


def help_text() -> str:
    """The ``--dataset`` help: every source's names and what it is."""
    return "; ".join(f"{' or '.join(s.names)} ({s.summary})" for s in REGISTRY) + (
        f"; default {DEFAULT}"
    )


__all__ = ["DEFAULT", "REGISTRY", "Source", "help_text", "names", "source_for"]
