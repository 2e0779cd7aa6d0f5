"""A user's own dataset: ``--dataset package.module:function``.

The factory is called with no arguments, or with ``data_root=`` when it accepts it,
and returns a map-style ``torch.utils.data.Dataset`` of (input, target) samples. A
factory that accepts ``transfer=`` opts into the pipeline search: it returns uint8
image tensors for ``transfer="uint8"`` and float32 normalized ones otherwise, and
thread workers are tried for it; decoding stays in its own code. It is called for
every measurement, since its dataset may hold state that must not carry over.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from torch.utils.data import Dataset

from raytune_loader.errors import DatasetError
from raytune_loader.factories import import_factory
from raytune_loader.sources.base import Source

if TYPE_CHECKING:
    from raytune_loader.datasets import DatasetSpec

TRANSFER_KEYWORD = "transfer"  # a dataset factory that takes it opts into pipeline search


class Factory(Source):
    names = ("package.module:function",)
    summary = "your factory returning a map-style Dataset of (input, target)"
    cached = False  # its dataset may hold state that must not carry over to the next trial

    def matches(self, name: str) -> bool:
        return ":" in name

    def _factory(self, spec: DatasetSpec) -> Any:
        return import_factory(spec.name, kind="dataset", error=DatasetError)

    def build(self, spec: DatasetSpec, transfer: str = "float32", decode: str = "pil") -> Dataset:
        factory = self._factory(spec)
        params = inspect.signature(factory).parameters
        kwargs: dict[str, Any] = {"data_root": spec.data_root} if "data_root" in params else {}
        if TRANSFER_KEYWORD in params:
            kwargs[TRANSFER_KEYWORD] = transfer
        try:
            dataset = factory(**kwargs)
        except (OSError, ValueError, TypeError) as exc:
            raise DatasetError(f"{spec.name} failed to build the dataset: {exc}") from None
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise DatasetError(
                f"{spec.name} returned {type(dataset).__name__}, not a map-style torch Dataset "
                "(it needs __getitem__ and __len__)"
            )
        return dataset  # type: ignore[no-any-return]

    def pipeline_searched(self, spec: DatasetSpec) -> bool:
        return TRANSFER_KEYWORD in inspect.signature(self._factory(spec)).parameters


SOURCE = Factory()
