"""raytune_loader: find the DataLoader settings that keep your accelerator busy.

Run the search with ``python -m raytune_loader.search`` or
``run_search(SearchOptions(...))``; load its result with
``load_best_config(path).dataloader(dataset)``. ARCHITECTURE.md maps the modules.
"""

from __future__ import annotations

__version__ = "0.1.0"

from raytune_loader.api import SearchResult, run_search  # noqa: E402
from raytune_loader.errors import (  # noqa: E402
    ConfigError,
    DatasetError,
    ModelError,
    RaytuneLoaderError,
    SearchFailedError,
    SearchInterruptedError,
    UserInputError,
)
from raytune_loader.loader import build_dataloader  # noqa: E402
from raytune_loader.options import SearchOptions  # noqa: E402
from raytune_loader.records import TrialRecord  # noqa: E402
from raytune_loader.results import BestConfig, HardwareMismatchWarning, load_best_config  # noqa: E402
from raytune_loader.space import LoaderConfig  # noqa: E402

__all__ = [
    "BestConfig",
    "ConfigError",
    "DatasetError",
    "HardwareMismatchWarning",
    "LoaderConfig",
    "ModelError",
    "RaytuneLoaderError",
    "SearchFailedError",
    "SearchInterruptedError",
    "SearchOptions",
    "SearchResult",
    "TrialRecord",
    "UserInputError",
    "build_dataloader",
    "load_best_config",
    "run_search",
]
