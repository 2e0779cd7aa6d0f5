"""raytune_loader: find the DataLoader settings that keep your accelerator busy.

Run the search with ``python -m raytune_loader.search`` or
``run_search(SearchOptions(...))``; load its result with
``load_best_config(path).dataloader(dataset)``. ARCHITECTURE.md maps the modules.

The names below are imported on first use: ``import raytune_loader.synthetic`` (a
process that only writes JPEG files) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> the module it comes from; the one list of the package's public names
_PUBLIC = {
    "SearchResult": "api",
    "run_search": "api",
    "ConfigError": "errors",
    "DatasetError": "errors",
    "ModelError": "errors",
    "RaytuneLoaderError": "errors",
    "SearchFailedError": "errors",
    "SearchInterruptedError": "errors",
    "UserInputError": "errors",
    "build_dataloader": "loader",
    "SearchOptions": "options",
    "TrialRecord": "records",
    "BestConfig": "results",
    "HardwareMismatchWarning": "results",
    "load_best_config": "results",
    "LoaderConfig": "space",
}
__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:  # the same names for type checkers and editors (a test keeps them equal)
    from raytune_loader.api import SearchResult as SearchResult
    from raytune_loader.api import run_search as run_search
    from raytune_loader.errors import ConfigError as ConfigError
    from raytune_loader.errors import DatasetError as DatasetError
    from raytune_loader.errors import ModelError as ModelError
    from raytune_loader.errors import RaytuneLoaderError as RaytuneLoaderError
    from raytune_loader.errors import SearchFailedError as SearchFailedError
    from raytune_loader.errors import SearchInterruptedError as SearchInterruptedError
    from raytune_loader.errors import UserInputError as UserInputError
    from raytune_loader.loader import build_dataloader as build_dataloader
    from raytune_loader.options import SearchOptions as SearchOptions
    from raytune_loader.records import TrialRecord as TrialRecord
    from raytune_loader.results import BestConfig as BestConfig
    from raytune_loader.results import HardwareMismatchWarning as HardwareMismatchWarning
    from raytune_loader.results import load_best_config as load_best_config
    from raytune_loader.space import LoaderConfig as LoaderConfig


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    globals()[name] = value  # the next look-up does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
