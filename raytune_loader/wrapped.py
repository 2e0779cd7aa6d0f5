"""The datasets a dataset wraps: a ``Subset``'s, a measurement's, any wrapper that keeps
the one it wraps as ``.dataset``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def wrapped(dataset: Any) -> Iterator[Any]:
    """``dataset``, then each dataset under it through ``.dataset``, outermost first."""
    while dataset is not None:
        yield dataset
        dataset = getattr(dataset, "dataset", None)
