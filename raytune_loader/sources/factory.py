"""A user's own dataset: ``--dataset package.module:function``.

The factory is called with no arguments, or with ``data_root=`` when it accepts it,
and returns a ``torch.utils.data.Dataset`` of (input, target) samples: map-style, or
an ``IterableDataset`` (MosaicML streaming, LitData, a stream of your own), which
then splits itself across loader workers by ``get_worker_info()`` and across ranks
as it does in training. A factory that accepts ``transfer=`` opts into the pipeline
search: it returns uint8 image tensors for ``transfer="uint8"`` and float32
normalized ones otherwise, and, map-style, thread workers are tried for it; decoding
stays in its own code. It is called for every measurement, since its dataset may
hold state that must not carry over.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from raytune_loader.errors import DatasetError
from raytune_loader.factories import import_factory
from raytune_loader.loaders.shard_stream import StreamVariant
from raytune_loader.sources.base import Source, Spec

TRANSFER_KEYWORD = "transfer"  # a dataset factory that takes it opts into pipeline search


class Factory(Source):
    """A user's own dataset: ``--dataset package.module:function`` returning a map-style
    ``Dataset`` or an ``IterableDataset`` of (input, target)."""

    names = ("package.module:function",)
    summary = "your factory returning a Dataset or IterableDataset of (input, target)"
    cached = False  # its dataset may hold state that must not carry over to the next trial

    def __init__(self) -> None:
        # The dataset called once to see whether it streams (_streams), unread: the next
        # build with the same arguments takes it instead of calling the factory again
        # (an ImageFolder over ImageNet lists 1.28M files each call).
        self._probed: dict[Spec, tuple[dict[str, Any], Any]] = {}

    def matches(self, name: str) -> bool:
        return ":" in name

    def _factory(self, spec: Spec) -> Any:
        return import_factory(spec.name, kind="dataset", error=DatasetError)

    def build(self, spec: Spec, transfer: str = "float32", decode: str = "pil") -> Dataset:
        dataset = self._called(spec, transfer)
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise DatasetError(
                f"{spec.name} returned {type(dataset).__name__}, not a map-style torch Dataset "
                "(it needs __getitem__ and __len__) nor an IterableDataset"
            )
        return dataset  # type: ignore[no-any-return]

    def _kwargs(self, spec: Spec, transfer: str) -> dict[str, Any]:
        params = inspect.signature(self._factory(spec)).parameters
        kwargs: dict[str, Any] = {"data_root": spec.data_root} if "data_root" in params else {}
        if TRANSFER_KEYWORD in params:
            kwargs[TRANSFER_KEYWORD] = transfer
        return kwargs

    def _called(self, spec: Spec, transfer: str) -> Any:
        kwargs = self._kwargs(spec, transfer)
        probed_with, probed = self._probed.pop(spec, (None, None))  # held until one build
        if probed_with == kwargs:
            return probed
        del probed  # built with other arguments: not alive beside the new one
        try:
            dataset = self._factory(spec)(**kwargs)
        except (OSError, ValueError, TypeError) as exc:
            raise DatasetError(f"{spec.name} failed to build the dataset: {exc}") from None
        return dataset

    def decoders(self, spec: Spec, cuda: bool) -> tuple[str, ...]:
        return ("pil",)  # the dataset's own code decodes as it does

    def files(self, dataset: Dataset, indices: list[int]) -> list[str]:
        return []  # unknown: the user's dataset reads what it reads

    def shards(self, spec: Spec) -> list[str]:
        return []  # a stream of the user's splits itself (measuring.shards checks it)

    def pipeline_searched(self, spec: Spec) -> bool:
        return TRANSFER_KEYWORD in inspect.signature(self._factory(spec)).parameters

    def accesses(self, spec: Spec) -> tuple[str, ...]:
        return ("stream",) if _streams(self, spec) else ("map",)

    def ray_data_reads(self, spec: Spec) -> bool:
        # map-style: Ray Data's actors hold the dataset and read it by index; a stream of
        # the user's splits by get_worker_info, which Ray Data's actors do not set
        return not _streams(self, spec)

    def thread_workers(self, spec: Spec) -> bool:
        # a stream of the user's splits by get_worker_info, which threads do not set
        return self.pipeline_searched(spec) and not _streams(self, spec)

    def build_stream(
        self, spec: Spec, shards: list[str], variant: StreamVariant
    ) -> IterableDataset:
        dataset = self._called(spec, variant.transfer)
        if not isinstance(dataset, IterableDataset):
            raise DatasetError(f"{spec.name} returned {type(dataset).__name__}, not a stream")
        return _Repeated(dataset) if variant.repeat else dataset

    def describe(self, spec: Spec) -> dict[str, Any]:
        return {"kind": "factory", "factory": spec.name}


class _Repeated(IterableDataset):  # type: ignore[type-arg]
    """The user's stream, over and over (a trial's one long epoch); its own worker split
    holds on every pass. A stream that yields nothing ends."""

    def __init__(self, stream: IterableDataset) -> None:
        self.stream = stream

    def __iter__(self) -> Any:
        while True:
            produced = False
            for sample in self.stream:
                produced = True
                yield sample
            if not produced:
                return


@functools.lru_cache(maxsize=8)
def _streams(source: Factory, spec: Spec) -> bool:
    """Whether the factory returns a stream (found once per process, by calling it; the
    next build with the same arguments takes what it returned)."""
    kwargs = source._kwargs(spec, "float32")
    dataset = source._called(spec, "float32")
    source._probed[spec] = (kwargs, dataset)
    return isinstance(dataset, IterableDataset)


SOURCE = Factory()
