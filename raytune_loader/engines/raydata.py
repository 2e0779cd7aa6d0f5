"""The Ray Data engine: actors anywhere in the cluster make the batches, the trial reads them.

A candidate with ``engine="raydata"`` runs as the
:class:`~raytune_loader.raydata.config.RayDataConfig` of its knobs
(:mod:`raytune_loader.raydata` builds and reads the pipeline). Its actors take bundles
of their own beside the trial's; what it holds ahead of the loop is its prefetched
batches in the training process and its blocks in the node's object store; its segment
watches what the actors and the object store did (:class:`PipelineWatch`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from raytune_loader.candidates.config import CONFIG_KEYS, LoaderConfig
from raytune_loader.engines.base import Engine, Held, SegmentWatch, Verdict
from raytune_loader.errors import ConfigError
from raytune_loader.raydata.config import RayDataConfig
from raytune_loader.raydata.dataset import build_dataset
from raytune_loader.raydata.receiving import RayDataLoader
from raytune_loader.raydata.reservation import actor_bundles
from raytune_loader.raydata.rows import rows_of

if TYPE_CHECKING:
    from torch.utils.data import Dataset

TASKS_PER_ACTOR = 2  # Ray Data's map tasks in flight per actor (max_concurrency 1 x factor 2)


class RayDataEngine(Engine):
    """A Ray Data pipeline whose ``map_batches`` actors run the variant's worker side."""

    name = "raydata"
    remote = True
    whole = True  # backpressure and Ray's USS come with an execution read to its end
    columns = CONFIG_KEYS
    use = (
        "dataset = tuned.raydata_dataset() (Ray Train: datasets={'train': dataset}, "
        "iter_torch_batches(**tuned.iteration_arguments()))"
    )

    def __init__(self, config: LoaderConfig) -> None:
        super().__init__(config)
        self.pipeline = RayDataConfig.from_dict(config.raydata_values())

    def bundles(self, pin: str | None) -> list[dict[str, float]]:
        return actor_bundles(self.pipeline, pin)

    def source_variant(self, accesses: tuple[str, ...]) -> LoaderConfig:
        """The dataset whose files or rows the actors read (on a stream-only source, its
        shards)."""
        access = self.config.access if self.config.access in accesses else accesses[0]
        return self.pipeline.source_variant(access)

    @contextlib.contextmanager
    def segment_loader(
        self, dataset: Dataset[Any], samples: int, seed: int, timeout_s: float
    ) -> Iterator[RayDataLoader]:
        """Forks nothing: its actors are processes of the cluster, and its execution
        ends with the block (``timeout_s`` is the trial's: Ray Data has no batch timeout)."""
        rows = rows_of(dataset)
        yield RayDataLoader(
            build_dataset(rows, self.pipeline, seed=seed, samples=samples), self.pipeline,
            stamp=True,
        )  # fmt: skip

    def in_flight(self) -> int:
        """``prefetch_batches`` (and the one being formatted) in the training process, and
        each actor's map calls in flight (:data:`TASKS_PER_ACTOR`, a training batch at
        least each). Blocks waiting in the object store are bounded by bytes, not
        batches: the actors' stamps keep them out of the rate
        (:mod:`raytune_loader.measuring.steady`, rule 2)."""
        pipeline = self.pipeline
        rows = pipeline.map_batch_size or pipeline.batch_size
        in_actors = pipeline.max_actors * TASKS_PER_ACTOR * math.ceil(rows / pipeline.batch_size)
        return pipeline.prefetch_batches + 1 + in_actors

    def producers(self) -> int:
        """The actors (each stamp is its actor's wall time, so actors sharing a core
        each count, their times stretched)."""
        return self.pipeline.max_actors

    def held(self, sample_bytes: int) -> Held:
        """The prefetched batches and the one being formatted in the training process;
        in the node's object store (in ``/dev/shm``), the execution's budget where one
        is set, else the blocks of those batches and of each actor's map calls in flight
        (Ray Data holds them there, zero-copy, until the loop has taken them)."""
        pipeline = self.pipeline
        batch = sample_bytes * pipeline.batch_size
        host = batch * (pipeline.prefetch_batches + 1)
        store = pipeline.object_store_bytes or batch * self.in_flight()
        fix = "a smaller object_store_bytes, map_batch_size or prefetch_batches"
        return Held(host, store, "object store blocks", fix)

    def segment_watch(self, loader: Any) -> SegmentWatch | None:
        watch: SegmentWatch | None = loader.watch
        return watch

    def settings(self) -> dict[str, Any]:
        return {"engine": self.name, "raydata": self.config.raydata_values()}

    def section(self, verdict: Verdict) -> dict[str, Any]:
        """``raydata``: the pipeline's knobs, its figures, what it reserved (the trial's
        CPUs, the actors', those the space offered) and its findings."""
        reserved = {"trial_cpus": verdict.trial_cpus, "actor_cpus": self.config.actor_cpus,
                    "offered_cpus": verdict.offered_cpus}  # fmt: skip
        return {self.name: {
            "chosen": verdict.chosen,
            "name": verdict.name,
            "config": self.config.raydata_values(),
            "metrics": verdict.metrics,
            "speedup_vs_dataloader": verdict.speedup_vs_dataloader,
            "reserved": reserved,
            "remote_cpus_to_ceiling": verdict.cpus_to_ceiling,
            "findings": verdict.findings,
        }}  # fmt: skip

    @classmethod
    def read_section(cls, data: Mapping[str, Any]) -> RayDataConfig | None:
        """The ``raydata`` section's pipeline (no Ray imported)."""
        section = data.get(cls.name)
        if section is None:
            return None
        config = section.get("config") if isinstance(section, Mapping) else None
        if not isinstance(config, Mapping):
            raise ConfigError("'raydata' must hold a 'config' object; re-run the search")
        try:
            return RayDataConfig.from_dict(dict(config))
        except (ConfigError, TypeError) as exc:
            raise ConfigError(f"invalid raydata section: {exc}") from None

    @classmethod
    def summary_lines(cls, data: Mapping[str, Any]) -> list[str]:
        """The best Ray Data candidate: chosen, or beside the chosen DataLoader."""
        config = cls.read_section(data)
        if config is None:
            return []
        section = data[cls.name]
        speed = section.get("metrics", {}).get("samples_per_s")
        speed = speed.get("median") if isinstance(speed, Mapping) else speed
        ratio = section.get("speedup_vs_dataloader")
        role = "chosen" if section.get("chosen") else "runner-up"
        against = f", {ratio:.2f}x the best DataLoader" if ratio else ""
        figure = f"{speed:.0f} samples/s" if speed else "no figure"
        return [f"\nRay Data ({role}): {config.label()}: {figure}{against}"]

    @classmethod
    def from_settings(cls, section: Mapping[str, Any]) -> LoaderConfig | None:
        knobs = section.get("raydata")
        if knobs is None:
            return None
        return RayDataConfig.from_dict(knobs).candidate()
