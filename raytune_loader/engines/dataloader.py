"""The DataLoader engine: worker processes or threads of the trial's own process.

Its batches come from :func:`~raytune_loader.loaders.loader.build_dataloader` (a
``DataLoader``, torchdata's thread workers, or a stream's loader); its workers run in
the trial's bundle, so it reserves nothing beside it. It holds
``num_workers x prefetch_factor`` batches ahead of the loop, in ``/dev/shm`` for worker
processes and, pinned, twice in host memory.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from raytune_loader.candidates.config import (
    CONFIG_KEYS,
    PIPELINE_KEYS,
    RAYDATA_KEYS,
    WORKER_KEYS,
    LoaderConfig,
)
from raytune_loader.engines.base import Engine, Held, SegmentWatch, Verdict
from raytune_loader.errors import ConfigError
from raytune_loader.loaders.loader import build_dataloader

if TYPE_CHECKING:
    from torch.utils.data import DataLoader, Dataset

# the first files with a pipeline section described it in words: "cpu" was PIL in the
# workers, "main process" a loader without workers
_LEGACY = {"cpu": "pil", "main process": "process"}


class DataLoaderEngine(Engine):
    """A ``DataLoader`` (or its thread and stream equivalents) in the trial's process."""

    name = "dataloader"
    remote = False
    columns = tuple(k for k in CONFIG_KEYS if k not in ("engine", *RAYDATA_KEYS))
    use = "loader = tuned.dataloader(tuned.dataset())"

    def bundles(self, pin: str | None) -> list[dict[str, float]]:
        return []  # its workers take the trial's own CPUs (1 + num_workers)

    def source_variant(self, accesses: tuple[str, ...]) -> LoaderConfig:
        if self.config.access in accesses:
            return self.config
        # one batch of a stream-only source read by index (the ceiling's)
        return replace(self.config, access=accesses[0], batching="loader")

    @contextlib.contextmanager
    def segment_loader(
        self, dataset: Dataset[Any], samples: int, seed: int, timeout_s: float
    ) -> Iterator[DataLoader[Any] | Any]:
        """The process's objects are frozen out of the garbage collector while the
        workers run (unless its caller froze them already): a forked worker's first full
        collection would otherwise write to every object it inherited and copy the main
        process's whole heap once (hundreds of MB for a process holding torch and a test
        session's modules), which the memory fit reads as a rate of copies per sample
        when its few private-memory readings straddle it. Reference counts still copy
        the pages of the objects a worker reads: what the fit is for."""
        freeze = gc.get_freeze_count() == 0
        loader = build_dataloader(
            dataset, self.config, timeout_s=timeout_s, seed=seed, samples_per_epoch=samples,
            stamp=True,
        )  # fmt: skip
        if freeze:
            gc.freeze()  # before the first batch forks the workers
        try:
            yield loader
        finally:
            if freeze:
                gc.unfreeze()
            del loader
            gc.collect()

    def in_flight(self) -> int:
        """``prefetch_factor`` ready per worker plus the one each worker is making
        (process workers; torchdata's thread mapper and the stream threads hold the
        same), and one more each in the pin-memory and prefetch threads; none without
        workers."""
        config = self.config
        if config.num_workers == 0:
            return 0
        return config.num_workers * ((config.prefetch_factor or 2) + 1) + 2

    def producers(self) -> int:
        """The workers, or the loop itself."""
        return max(1, self.config.num_workers)

    def held(self, sample_bytes: int) -> Held:
        config = self.config
        batch = sample_bytes * config.batch_size
        batches = config.num_workers * (config.prefetch_factor or 0) if config.num_workers else 1
        host = batch * batches * (2 if config.pin_memory else 1)
        shm = batch * batches if config.num_workers and config.workers == "process" else 0
        return Held(host, shm, "batches", "fewer workers or a smaller prefetch_factor")

    def segment_watch(self, loader: Any) -> SegmentWatch | None:
        return None  # its workers are the trial's processes: the watcher reads them

    def settings(self) -> dict[str, Any]:
        config = self.config
        return {"loader": config.kwargs(), "pipeline": config.pipeline(),
                "worker_init": config.worker_init()}  # fmt: skip

    def section(self, verdict: Verdict) -> dict[str, Any]:
        """None of its own: the file's ``loader``, ``pipeline`` and ``worker_init``
        (:meth:`settings`) are the DataLoader's."""
        return {}

    @classmethod
    def read_section(cls, data: Mapping[str, Any]) -> None:
        """None: :meth:`from_settings` reads the DataLoader's sections."""
        return None

    @classmethod
    def summary_lines(cls, data: Mapping[str, Any]) -> list[str]:
        """None: the summary's table and pipeline line are the DataLoader's."""
        return []

    @classmethod
    def from_settings(cls, section: Mapping[str, Any]) -> LoaderConfig | None:
        """A ``loader`` section with its ``pipeline`` and ``worker_init`` (baselines have
        no ``worker_init``: workers with the libraries' own thread pools; a ``pipeline``
        only where the winner's is written, and not in older files: the default one;
        older files lack ``worker_init`` too)."""
        loader = section.get("loader")
        if loader is None:
            return None
        if not isinstance(loader, Mapping):
            raise ConfigError("the loader section must be a JSON object")
        pipeline = section.get("pipeline") or {}
        chosen = {k: _LEGACY.get(pipeline[k], pipeline[k]) for k in PIPELINE_KEYS if k in pipeline}
        worker_init = section.get("worker_init") or {}
        settings = {k: v for k, v in worker_init.items() if k in WORKER_KEYS}
        return LoaderConfig.from_dict({**loader, **chosen, **settings})
