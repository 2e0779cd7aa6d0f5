"""The one place a DataLoader is built from a :class:`LoaderConfig`.

Trials, the verification step, the bench and users' training code (through
``load_best_config(...).dataloader(dataset)``) all call :func:`build_dataloader`,
so what was measured is what users get.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from raytune_loader.space import LoaderConfig


def build_dataloader(
    dataset: Dataset[Any],
    config: LoaderConfig,
    *,
    shuffle: bool = True,
    drop_last: bool = True,
    timeout_s: float = 0.0,
    seed: int | None = None,
    **overrides: Any,
) -> DataLoader[Any]:
    """DataLoader with the tuned settings; ``overrides`` win over the config."""
    kwargs: dict[str, Any] = config.kwargs()
    if config.num_workers == 0:
        for key in ("prefetch_factor", "persistent_workers", "multiprocessing_context"):
            kwargs.pop(key)  # DataLoader accepts them only with workers
        timeout_s = 0.0  # DataLoader only accepts a timeout with workers
    if config.pin_memory and not torch.cuda.is_available():
        kwargs["pin_memory"] = False  # pinning needs an accelerator; it would only warn
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    kwargs.update(overrides)
    return DataLoader(
        dataset,
        shuffle=shuffle,
        drop_last=drop_last,
        timeout=timeout_s,
        generator=generator,
        **kwargs,
    )
