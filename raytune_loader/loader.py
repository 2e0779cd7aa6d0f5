"""The one place a loader is built from a :class:`LoaderConfig`.

Trials, the verification step, the bench and users' training code (through
``load_best_config(...).dataloader(dataset)``) all call :func:`build_dataloader`,
so what was measured is what users get. Worker processes are PyTorch's
``DataLoader``; thread workers are ``torchdata.nodes`` (PyTorch's maintained
node-based loader): each thread builds whole batches, as a DataLoader worker does,
so ``num_workers``, ``prefetch_factor`` and ``in_order`` mean the same in both.

In a process group both read their own rank's shard of every epoch
(:mod:`raytune_loader.sharding`), so a trainer that keeps the loader (Lightning,
Ray Train, a DDP loop) or rebuilds it from its arguments (accelerate) runs the tuned
settings on the right samples; the rank measurements of ``--ranks-per-node`` build
their loaders the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    default_collate,
)
from torch.utils.data.distributed import DistributedSampler

from raytune_loader.errors import ConfigError
from raytune_loader.pipeline import collate_encoded
from raytune_loader.sharding import RankBatches, ShardSampler, process_group
from raytune_loader.space import LoaderConfig


def build_dataloader(
    dataset: Dataset[Any],
    config: LoaderConfig,
    *,
    shuffle: bool = True,
    drop_last: bool = True,
    timeout_s: float = 0.0,
    seed: int | None = None,
    samples_per_epoch: int | None = None,
    **overrides: Any,
) -> TunedDataLoader | ThreadLoader:
    """The tuned loader over ``dataset``; ``overrides`` (DataLoader arguments) win over
    the config. Thread workers take ``sampler`` and ``collate_fn`` among them.

    Without a ``sampler`` override the loader shards itself in a process group: each rank
    reads its own share of every epoch (:mod:`raytune_loader.sharding`), whoever iterates
    it. ``samples_per_epoch`` (per rank) makes an epoch longer or shorter than the data.
    """
    kwargs: dict[str, Any] = config.kwargs()
    if config.num_workers == 0:
        for key in ("prefetch_factor", "persistent_workers", "multiprocessing_context"):
            kwargs.pop(key)  # DataLoader accepts them only with workers
        timeout_s = 0.0  # DataLoader only accepts a timeout with workers
    if config.pin_memory and not torch.cuda.is_available():
        kwargs["pin_memory"] = False  # pinning needs an accelerator; it would only warn
    if config.decode == "device":
        kwargs["collate_fn"] = collate_encoded  # JPEGs of different lengths stay a list
    kwargs.update(overrides)
    _refuse_unsupported(dataset, config, kwargs.get("sampler"))
    if "batch_sampler" in kwargs:
        raise ConfigError(
            "the tuned loader makes its own batches (batch_size is tuned): "
            "pass sampler=, not batch_sampler="
        )
    if kwargs.get("sampler") is None:
        kwargs["sampler"] = ShardSampler(
            dataset,
            shuffle=shuffle,
            seed=seed or 0,
            samples=samples_per_epoch,  # type: ignore[arg-type]
        )
    if config.workers == "thread":
        unsupported = set(overrides) - {"sampler", "collate_fn", *config.kwargs()}
        if unsupported:
            raise ConfigError(
                f"thread workers take sampler and collate_fn, not {', '.join(sorted(unsupported))}"
            )
        return ThreadLoader(
            dataset, BatchSampler(kwargs["sampler"], kwargs["batch_size"], drop_last),
            kwargs.get("collate_fn") or default_collate, config.num_workers,
            kwargs["prefetch_factor"] or 2, kwargs["in_order"], kwargs["pin_memory"],
        )  # fmt: skip
    return TunedDataLoader(dataset, drop_last=drop_last, timeout=timeout_s, **kwargs)


def _refuse_unsupported(dataset: Dataset[Any], config: LoaderConfig, sampler: Any) -> None:
    """Refuse now, in one line, what would fail or silently duplicate data later."""
    if isinstance(dataset, IterableDataset):
        raise ConfigError(
            "the tuned loader reads map-style datasets (with __getitem__ and __len__); "
            f"{type(dataset).__name__} is an IterableDataset"
        )
    world = process_group()[1]
    if (
        config.workers == "thread"
        and world > 1
        and sampler is not None
        and not isinstance(sampler, DistributedSampler)
    ):
        raise ConfigError(
            f"thread workers read what the sampler gives, and {type(sampler).__name__} "
            f"gives every one of the {world} ranks the same samples: pass a "
            "DistributedSampler, or no sampler (the tuned loader then shards itself)"
        )


class TunedDataLoader(DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` that reads its own rank's shard when it runs in a process group.

    Its constructor is DataLoader's, so trainers that rebuild a loader from its
    arguments (Lightning) rebuild it with the tuned ones. Only its own iteration is
    sharded by rank (:class:`~raytune_loader.sharding.RankBatches`); its
    ``batch_sampler`` yields whole epochs, for trainers that split batches themselves.
    """

    @property
    def _index_sampler(self) -> Any:
        index_sampler = super()._index_sampler
        if isinstance(index_sampler, BatchSampler):
            return RankBatches(index_sampler)
        return index_sampler


class ThreadLoader:
    """Batches from ``num_workers`` threads (``torchdata.nodes``): each thread reads
    and collates a whole batch; up to ``prefetch_factor`` x ``num_workers`` batches
    wait ready. Iterating again starts a new epoch, like a DataLoader. Decoding and
    the tensor transforms release the GIL; a Python-heavy ``__getitem__`` does not.

    It has a DataLoader's attributes (``dataset``, ``sampler``, ``batch_sampler``,
    ``batch_size``, ``num_workers``...) so trainers find its sampler (to call
    ``set_epoch``) and see that it is already sharded; no trainer rebuilds it."""

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_sampler: BatchSampler,
        collate_fn: Callable[[list[Any]], Any],
        num_workers: int,
        prefetch_factor: int,
        in_order: bool,
        pin_memory: bool,
    ) -> None:
        import torchdata.nodes as tn

        def batch(indices: Sequence[int]) -> Any:
            return collate_fn([dataset[i] for i in indices])

        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.sampler = batch_sampler.sampler
        self.batch_size = batch_sampler.batch_size
        self.drop_last = batch_sampler.drop_last
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.in_order = in_order
        self.pin_memory = pin_memory
        self._batches = RankBatches(batch_sampler)
        node: Any = tn.ParallelMapper(
            tn.SamplerWrapper(self._batches),  # type: ignore[arg-type]
            map_fn=batch,
            num_workers=num_workers,
            method="thread",
            in_order=in_order,
            max_concurrent=num_workers,
        )
        if pin_memory:
            node = tn.PinMemory(node)
        self._loader = tn.Loader(tn.Prefetcher(node, prefetch_factor * num_workers))

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._loader
        finally:  # an epoch ended, failed or was abandoned: its threads stop, here
            _stop_threads(self._loader)

    def __len__(self) -> int:
        return len(self._batches)


def _stop_threads(node: Any, seen: set[int] | None = None) -> None:
    """Stop the threads of a torchdata node tree now, from this thread.

    torchdata.nodes 0.11 has no public shutdown: an abandoned epoch's threads end when
    its iterators are garbage-collected, which may happen in one of those threads
    ("cannot join current thread", printed in the user's training loop). Its iterators'
    own ``_shutdown`` (what their ``__del__`` calls) is called outer node first; a
    later torchdata without it leaves the threads to the garbage collector as before.
    """
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
    stop = getattr(node, "_shutdown", None)
    if callable(stop):
        stop()
    for name in ("root", "_it", "source"):
        child = getattr(node, name, None)
        if child is not None:
            _stop_threads(child, seen)
