"""The training process's side of a pipeline: its batches, and what a segment watches.

:class:`RayDataLoader` iterates a Ray Dataset (or one ``streaming_split`` part per
rank) as the DataLoader path yields batches, each wrapped as a
:class:`~raytune_loader.loaders.batches.Stamped` from the actors' own times when
measured; :func:`iteration_arguments` are ``iter_torch_batches``' arguments for training
code; :class:`PipelineWatch` is what a measured segment shows beyond its rate (spill,
the actors' memory, backpressure).
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from raytune_loader.errors import CorruptSampleError
from raytune_loader.raydata.actors import STORE_COLUMNS
from raytune_loader.raydata.config import RayDataConfig
from raytune_loader.stores.store import Counts, window_figures

if TYPE_CHECKING:
    import numpy as np
    import ray.data

log = logging.getLogger(__name__)


# The training process's side ---------------------------------------------------------------


def batch_collate(decode: str, stamp: bool = False, watch: PipelineWatch | None = None) -> Any:
    """``iter_torch_batches``' ``collate_fn`` for a variant: a numpy batch of made
    samples as the DataLoader path's batch, ``[images, labels]`` (images a tensor, or an
    :class:`~raytune_loader.pipeline.device.EncodedBatch` of the files), zero-copy from the
    object store. With ``stamp``, a :class:`~raytune_loader.loaders.batches.Stamped` whose
    ``made - started`` is the actors' own time for its rows (on their hosts' clocks:
    only the difference means anything); ``watch`` reads what the actors said of their
    memory."""
    return _collate_class()(decode, stamp, watch)


@functools.cache
def _collate_class() -> type:
    """The collate class, made on first use: a ``NumpyBatchCollateFn`` (Ray 2.47
    deprecated plain functions), without importing Ray Data with this module."""
    from ray.data.collate_fn import NumpyBatchCollateFn

    class BatchCollate(NumpyBatchCollateFn):  # type: ignore[misc]
        def __init__(self, decode: str, stamp: bool, watch: PipelineWatch | None) -> None:
            self.decode = decode
            self.stamp = stamp
            self.watch = watch

        def __call__(self, batch: dict[str, np.ndarray]) -> Any:
            if self.watch is not None:
                self.watch.saw(batch)
            return _collated(batch, self.decode, self.stamp)

    return BatchCollate


def _collated(batch: dict[str, np.ndarray], decode: str, stamp: bool) -> Any:
    import torch
    from ray.data.util.torch_utils import convert_ndarray_to_torch_tensor

    labels = convert_ndarray_to_torch_tensor(batch["label"])
    if decode == "device":
        from raytune_loader.pipeline.device import collate_encoded

        files = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in batch["image"]]
        out = collate_encoded(list(zip(files, labels.tolist(), strict=True)))
    else:
        out = [convert_ndarray_to_torch_tensor(batch["image"]), labels]
    if not stamp:
        return out
    from raytune_loader.loaders.batches import Stamped

    cost = float((batch["_made"] - batch["_started"]).sum())
    made = float(batch["_made"].max())
    return Stamped(out, made - cost, made)


def iteration_arguments(
    config: RayDataConfig,
    *,
    stamp: bool = False,
    device: str = "cpu",
    watch: PipelineWatch | None = None,
) -> dict[str, Any]:
    """``iter_torch_batches``' keyword arguments for ``config``: for a plain loop, a
    ``get_dataset_shard(...)`` in Ray Train, and the trial alike. ``device="cpu"``
    leaves the batch on the host, as a DataLoader does; the variant's device side
    (:func:`raytune_loader.pipeline.device.to_device`) then moves and finishes it."""
    return {
        "batch_size": config.batch_size,
        "prefetch_batches": config.prefetch_batches,
        "collate_fn": batch_collate(config.decode, stamp, watch),
        "drop_last": True,
        "device": device,
    }


class RayDataLoader:
    """The batches of a Ray Dataset (or one ``streaming_split`` part) as a training loop
    reads them: each ``iter()`` an epoch, one execution of the pipeline whose actors end
    with it, however it ends (a generator: closing it shuts the execution down, as an
    abandoned DataLoader epoch's workers end)."""

    def __init__(self, source: ray.data.Dataset | ray.data.DataIterator, config: RayDataConfig,
                 *, stamp: bool = False) -> None:  # fmt: skip
        self.source = source
        self.config = config
        self.stamp = stamp
        self.batch_size = config.batch_size
        self.watch = PipelineWatch() if stamp else None  # a measured loader's

    def __iter__(self) -> Iterator[Any]:
        arguments = iteration_arguments(self.config, stamp=self.stamp, watch=self.watch)
        batches = iter(self.source.iter_torch_batches(**arguments))
        corrupt: str | None = None
        failed = False
        try:
            yield from batches
            if self.watch is not None:  # the epoch's execution is over: its figures
                self.watch.executed(self.source)
        except CorruptSampleError as exc:
            # Ray's wrapper is one too; its cause's first line is the actor's, naming the
            # file (Ray Data appends its advice on retries below it)
            said = str(getattr(exc, "cause", exc)).strip().splitlines()
            corrupt = said[0] if said else "corrupt sample"
        except BaseException:
            failed = True
            raise
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # Ray Data's own finally shuts the executor and its actors down
            if failed or corrupt is not None:
                # Ray Data leaves a failed execution in reference cycles that hold its
                # actors' handles: its actors end at the next collection, so now
                gc.collect()
        if corrupt is not None:
            # raised here, not from the wrapper: its frames hold the execution, whose
            # actors would live as long as the error does
            raise CorruptSampleError(corrupt)


class PipelineWatch:
    """What a measured Ray Data segment shows beyond its rate: the bytes Ray spilled from
    the object store during the window (the cluster's count, before and after), the
    largest resident memory an actor reported and the least memory its node had free,
    Ray Data's own figures of its last full execution (the largest USS it measured in
    the actors' map tasks; the time its executor held the actors' tasks back,
    backpressure), and on a bucket what the actors asked of the store for the batches
    received during the window (requests, retries by cause, time in flight)."""

    def __init__(self) -> None:
        self.actor_rss = 0
        self.actor_free: int | None = None
        self._spilled: list[int | None] = []
        self.stats: dict[str, Any] = {}
        self._lock = threading.Lock()  # Ray's threads collate the batches ahead
        self._window: list[float] = []  # when the window started (and ended)
        self._asked: dict[str, int] | None = None  # a store's counts over the window

    def saw(self, batch: Mapping[str, Any]) -> None:
        """A batch's rows as the actors made them: what they said of their memory, and
        of a store's requests (counted while the window is open)."""
        if "_rss" in batch and len(batch["_rss"]):
            self.actor_rss = max(self.actor_rss, int(batch["_rss"].max()))
            free = int(batch["_free"].min())
            self.actor_free = free if self.actor_free is None else min(self.actor_free, free)
        if STORE_COLUMNS[0] not in batch:
            return
        with self._lock:
            if len(self._window) != 1:
                return
            asked = self._asked if self._asked is not None else dict.fromkeys(Counts.NAMES, 0)
            for column, name in zip(STORE_COLUMNS, Counts.NAMES, strict=True):
                asked[name] += int(batch[column].sum())
            self._asked = asked

    def window_started(self) -> None:
        """The window starts: the cluster's spilled bytes so far."""
        self._spilled = [spilled_bytes()]
        with self._lock:
            self._window, self._asked = [time.monotonic()], None

    def window_ended(self) -> None:
        """The window ends: the cluster's spilled bytes now."""
        self._spilled.append(spilled_bytes())
        with self._lock:
            self._window.append(time.monotonic())

    def executed(self, source: Any) -> None:
        """An execution read to its end: Ray Data's figures of its map operator."""
        summary = getattr(source, "get_stats_summary", None)
        extra = dict(getattr(summary(), "extra_metrics", None) or {}) if summary else {}
        uss = (extra.get("max_uss_bytes") or {}).get("max")
        held = [extra.get(k) for k in ("task_submission_backpressure_time",
                                       "task_output_backpressure_time_s")]  # fmt: skip
        self.stats = {
            "actor_uss_ray_bytes": None if uss is None else int(uss),
            "backpressure_s": sum(float(h) for h in held if h) if extra else None,
        }

    def figures(self) -> dict[str, Any]:
        """The segment's figures by :class:`~raytune_loader.measuring.outcomes.SegmentMetrics`'
        names."""
        start, end = (self._spilled + [None, None])[:2]
        return {
            "store_spilled_bytes": None if start is None or end is None else end - start,
            "actor_rss_bytes": self.actor_rss or None,
            "actor_free_bytes": self.actor_free,
            "actor_uss_ray_bytes": self.stats.get("actor_uss_ray_bytes"),
            "backpressure_s": self.stats.get("backpressure_s"),
            **self._store_figures(),
        }

    def _store_figures(self) -> dict[str, Any]:
        with self._lock:
            if self._asked is None or len(self._window) != 2:
                return {}
            return window_figures(self._asked, self._window[1] - self._window[0])


def spilled_bytes() -> int | None:
    """Bytes Ray has spilled from the cluster's object stores since it started (the
    reading Ray Data's own statistics take, from the GCS); None where it does not say."""
    import grpc
    import ray

    if not ray.is_initialized():
        return None
    try:
        from ray._private.internal_api import get_memory_info_reply, get_state_from_address

        address = ray.get_runtime_context().gcs_address
        return int(get_memory_info_reply(get_state_from_address(address)).store_stats
                   .spilled_bytes_total)  # fmt: skip
    except (ImportError, AttributeError, ConnectionError, RuntimeError, grpc.RpcError) as exc:
        log.debug("no spill reading: %s", exc)
        return None


def split_loaders(
    dataset: ray.data.Dataset,
    config: RayDataConfig,
    parts: int,
    *,
    stamp: bool = False,
    locality_hints: list[str] | None = None,
) -> list[RayDataLoader]:
    """One loader per rank: ``streaming_split(parts, equal=True)`` (each rank as many
    rows, so no rank of a synchronous step waits at an epoch's end for one that has
    none); the parts are disjoint and cover the dataset when its length divides."""
    splits = dataset.streaming_split(parts, equal=True, locality_hints=locality_hints)
    return [RayDataLoader(split, config, stamp=stamp) for split in splits]
