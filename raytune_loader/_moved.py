"""The module paths of the flat layout (0.1), kept working for one release.

Tune pickles a search's searcher, space and configurations by their module paths, so a
search folder made by 0.1 (``--resume``) names modules that moved when the package got
its rooms; a user's import may too. Each old path still imports, with a
``DeprecationWarning``: as its new home itself where the module moved whole, or as a
module that finds each name in its new homes where it was split. Remove in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from typing import Any

PACKAGE = "raytune_loader"

MOVED = {  # old module -> its new home, whole
    "backoff": "measuring.backoff",
    "batches": "loaders.batches",
    "bestconfig": "outputs.bestconfig",
    "console": "outputs.console",
    "costmodel": "tuning.costmodel",
    "datasets": "sources.datasets",
    "decoders": "pipeline.decoders",
    "findings": "verdict.findings",
    "hardware": "machine.hardware",
    "job": "measuring.job",
    "loader": "loaders.loader",
    "memory": "measuring.memory",
    "memoryfit": "measuring.memoryfit",
    "models": "measuring.models",
    "nvml": "machine.nvml",
    "options": "tuning.options",
    "outcomes": "measuring.outcomes",
    "plots": "outputs.plots",
    "prepare": "measuring.prepare",
    "probes": "verdict.probes",
    "profile": "measuring.profile",
    "ranks": "measuring.ranks",
    "records": "measuring.records",
    "searcher": "tuning.searcher",
    "selection": "verdict.selection",
    "sharding": "loaders.sharding",
    "steady": "measuring.steady",
    "step": "measuring.step",
    "synthetic": "sources.synthetic",
    "trainable": "tuning.trainable",
    "trainers": "outputs.trainers",
    "transforms": "pipeline.transforms",
    "tuner": "tuning.tuner",
    "watch": "machine.watch",
}
SPLIT = {  # old module -> the modules its names went to (and the ones it re-exported)
    "space": ("candidates.config", "candidates.rules", "tuning.space",
              "candidates.structure"),
    "measure": ("measuring.measure", "measuring.segment", "measuring.outcomes"),
    "streams": ("loaders.streams", "measuring.shards"),
    "results": ("files", "outputs.reader"),
    "verify": ("measuring.measurer", "verdict.verify"),
}  # fmt: skip


class _SplitModule(types.ModuleType):
    """An old module whose names now live in several: each found on first use."""

    def __init__(self, name: str, homes: tuple[str, ...]) -> None:
        super().__init__(name)
        self._homes = homes

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        for home in self._homes:
            module = importlib.import_module(f"{PACKAGE}.{home}")
            if hasattr(module, name):
                value = getattr(module, name)
                setattr(self, name, value)
                return value
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        names: set[str] = set()
        for home in self._homes:
            names |= set(dir(importlib.import_module(f"{PACKAGE}.{home}")))
        return sorted(names)


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``raytune_loader.<old>`` for the old paths above, nothing else."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        old = fullname.removeprefix(f"{PACKAGE}.")
        if fullname.startswith(f"{PACKAGE}.") and (old in MOVED or old in SPLIT):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        old = spec.name.removeprefix(f"{PACKAGE}.")
        return _SplitModule(spec.name, SPLIT[old]) if old in SPLIT else None

    def exec_module(self, module: types.ModuleType) -> None:
        old = module.__name__.removeprefix(f"{PACKAGE}.")
        new = MOVED.get(old) or ", ".join(SPLIT[old])
        warnings.warn(
            f"{module.__name__} is {PACKAGE}.{new} since 0.2; the old path goes in 0.3",
            DeprecationWarning,
            stacklevel=2,
        )
        if old in MOVED:  # the import returns what sys.modules holds: the module itself
            sys.modules[module.__name__] = importlib.import_module(f"{PACKAGE}.{MOVED[old]}")


def install() -> None:
    """Let the old paths import (once per process)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.append(_OldPaths())
