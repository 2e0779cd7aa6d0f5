"""raytune_loader: find the DataLoader settings that keep your accelerator busy.

Run the search with ``python -m raytune_loader.search`` or
``run_search(SearchOptions(...))``; load its result with
``load_best_config(path).dataloader(dataset)``. ARCHITECTURE.md maps the modules.

The names below are imported on first use: ``import raytune_loader.sources.synthetic`` (a
process that only writes JPEG files) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from raytune_loader import _moved

__version__ = "0.2.0"

# name -> the module it comes from; the one list of the package's public names
_PUBLIC = {
    "SearchResult": "api",
    "run_search": "api",
    "LoaderConfig": "candidates.config",
    "ConfigError": "errors",
    "DatasetError": "errors",
    "ModelError": "errors",
    "RaytuneLoaderError": "errors",
    "SearchFailedError": "errors",
    "SearchInterruptedError": "errors",
    "UserInputError": "errors",
    "build_dataloader": "loaders.loader",
    "TrialRecord": "measuring.records",
    "BestConfig": "outputs.reader",
    "HardwareMismatchWarning": "outputs.reader",
    "StoreMismatchWarning": "outputs.reader",
    "load_best_config": "outputs.reader",
    "to_device": "pipeline.device",
    "SearchOptions": "tuning.options",
}
__all__ = sorted(_PUBLIC)
_moved.install()  # the 0.1 module paths, for one release

if TYPE_CHECKING:  # the same names for type checkers and editors (a test keeps them equal)
    from raytune_loader.api import SearchResult as SearchResult
    from raytune_loader.api import run_search as run_search
    from raytune_loader.candidates.config import LoaderConfig as LoaderConfig
    from raytune_loader.errors import ConfigError as ConfigError
    from raytune_loader.errors import DatasetError as DatasetError
    from raytune_loader.errors import ModelError as ModelError
    from raytune_loader.errors import RaytuneLoaderError as RaytuneLoaderError
    from raytune_loader.errors import SearchFailedError as SearchFailedError
    from raytune_loader.errors import SearchInterruptedError as SearchInterruptedError
    from raytune_loader.errors import UserInputError as UserInputError
    from raytune_loader.loaders.loader import build_dataloader as build_dataloader
    from raytune_loader.measuring.records import TrialRecord as TrialRecord
    from raytune_loader.outputs.reader import BestConfig as BestConfig
    from raytune_loader.outputs.reader import HardwareMismatchWarning as HardwareMismatchWarning
    from raytune_loader.outputs.reader import StoreMismatchWarning as StoreMismatchWarning
    from raytune_loader.outputs.reader import load_best_config as load_best_config
    from raytune_loader.pipeline.device import to_device as to_device
    from raytune_loader.tuning.options import SearchOptions as SearchOptions


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    globals()[name] = value  # the next look-up does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
