"""The one place a loader is built from a :class:`LoaderConfig`.

Trials, the verification step, the bench and users' training code (through
``load_best_config(...).dataloader(dataset)``) all call :func:`build_dataloader`,
so what was measured is what users get. Worker processes are PyTorch's
``DataLoader``; thread workers are ``torchdata.nodes`` (PyTorch's maintained
node-based loader): each thread builds whole batches, as a DataLoader worker does,
so ``num_workers``, ``prefetch_factor`` and ``in_order`` mean the same in both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
)

from raytune_loader.errors import ConfigError
from raytune_loader.pipeline import collate_encoded
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
) -> DataLoader[Any] | ThreadLoader:
    """The tuned loader over ``dataset``; ``overrides`` (DataLoader arguments) win over
    the config. Thread workers take ``sampler`` and ``collate_fn`` among them."""
    kwargs: dict[str, Any] = config.kwargs()
    if config.num_workers == 0:
        for key in ("prefetch_factor", "persistent_workers", "multiprocessing_context"):
            kwargs.pop(key)  # DataLoader accepts them only with workers
        timeout_s = 0.0  # DataLoader only accepts a timeout with workers
    if config.pin_memory and not torch.cuda.is_available():
        kwargs["pin_memory"] = False  # pinning needs an accelerator; it would only warn
    if config.decode == "device":
        kwargs["collate_fn"] = collate_encoded  # JPEGs of different lengths stay a list
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    kwargs.update(overrides)
    if config.workers == "thread":
        unsupported = set(overrides) - {"sampler", "collate_fn", *config.kwargs()}
        if unsupported:
            raise ConfigError(
                f"thread workers take sampler and collate_fn, not {', '.join(sorted(unsupported))}"
            )
        sampler = kwargs.get("sampler") or (
            RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        )
        return ThreadLoader(
            dataset, BatchSampler(sampler, kwargs["batch_size"], drop_last),
            kwargs.get("collate_fn") or default_collate, config.num_workers,
            kwargs["prefetch_factor"] or 2, kwargs["in_order"], kwargs["pin_memory"],
        )  # fmt: skip
    return DataLoader(
        dataset,
        shuffle=shuffle,
        drop_last=drop_last,
        timeout=timeout_s,
        generator=generator,
        **kwargs,
    )


class ThreadLoader:
    """Batches from ``num_workers`` threads (``torchdata.nodes``): each thread reads
    and collates a whole batch; up to ``prefetch_factor`` x ``num_workers`` batches
    wait ready. Iterating again starts a new epoch, like a DataLoader. Decoding and
    the tensor transforms release the GIL; a Python-heavy ``__getitem__`` does not."""

    def __init__(
        self,
        dataset: Dataset[Any],
        batches: Iterable[Sequence[int]],
        collate_fn: Callable[[list[Any]], Any],
        num_workers: int,
        prefetch_factor: int,
        in_order: bool,
        pin_memory: bool,
    ) -> None:
        import torchdata.nodes as tn

        def batch(indices: Sequence[int]) -> Any:
            return collate_fn([dataset[i] for i in indices])

        node: Any = tn.ParallelMapper(
            tn.SamplerWrapper(batches),  # type: ignore[arg-type]
            map_fn=batch,
            num_workers=num_workers,
            method="thread",
            in_order=in_order,
            max_concurrent=num_workers,
        )
        if pin_memory:
            node = tn.PinMemory(node)
        self._loader = tn.Loader(tn.Prefetcher(node, prefetch_factor * num_workers))
        self.batch_sampler = batches

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._loader
        finally:  # an epoch ended, failed or was abandoned: its threads stop, here
            _stop_threads(self._loader)

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]


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
