"""Ray Data: a pipeline whose actors, anywhere in the cluster, make a candidate's batches.

Every Ray Data call of the package lives here, cut by side:
:class:`~raytune_loader.raydata.config.RayDataConfig` is one pipeline, valid by
construction; :mod:`~raytune_loader.raydata.reservation` what its actors reserve and
which nodes are beyond the trials'; :mod:`~raytune_loader.raydata.rows` a source as the
rows the actors read; :mod:`~raytune_loader.raydata.actors` what the actors run (the
variant's worker side); :mod:`~raytune_loader.raydata.dataset` the Ray Dataset built
from them; :mod:`~raytune_loader.raydata.receiving` the training process's side (its
batches, what a measured segment watches); :mod:`~raytune_loader.raydata.receive_cost`
what receiving costs the trials' node. The engine that runs a Ray Data candidate is
:class:`raytune_loader.engines.raydata.RayDataEngine`. No module imports Ray until it
builds or reads a pipeline; the actors count a store's requests with ``stores``. The
modules' names are also this room's (it was one module before 0.2), imported on first
use.

May import: the foundations, ``stores``, ``candidates``, ``pipeline``, ``loaders``.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = ("config", "reservation", "rows", "actors", "receiving", "dataset", "receive_cost")


def __getattr__(name: str) -> Any:
    if not name.startswith("__"):
        for module in _MODULES:
            found = importlib.import_module(f"{__name__}.{module}")
            if hasattr(found, name):
                return getattr(found, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
