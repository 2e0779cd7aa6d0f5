"""One Ray Data pipeline: :class:`RayDataConfig`, valid by construction.

The actors (a fixed count or a min-max pool), the CPUs each reserves, the rows of one
map call, ``prefetch_batches``, what crosses the object store (``float32`` or ``uint8``
images, or the ``encoded`` files for a device-side decode), the object store budget,
the block size and ``locality_with_output``. It converts to and from the search's
candidate (``engine="raydata"``); :func:`ray_docs_default` is the pipeline as Ray's
documentation writes it, the Ray Data baseline. No Ray is imported here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import ConfigError

log = logging.getLogger(__name__)


CROSSES = ("float32", "uint8", "encoded")  # what an actor puts in the object store per image


CPU_DECODERS = ("pil", "tensor")  # where an actor decodes: PIL, or to tensors (decoders.py)


@dataclass(frozen=True)
class RayDataConfig:
    """One Ray Data candidate. ``batch_size`` is the training batch
    (``iter_torch_batches``); ``min_actors`` = ``max_actors`` is a fixed pool, otherwise
    Ray's autoscaling pool between them; ``map_batch_size`` is the rows of one map call
    (``None``: Ray's default, whole blocks); ``crosses`` is what the actors put in the
    object store, ``decoder`` where they decode when they do (``encoded``: nowhere, the
    device decodes); ``object_store_bytes`` caps the execution's object store memory
    (``None``: Ray's share of the store), ``block_bytes`` is ``target_max_block_size``
    (``None``: Ray's 128 MiB)."""

    batch_size: int
    min_actors: int = 1
    max_actors: int = 1
    cpus_per_actor: float = 1.0
    map_batch_size: int | None = None
    prefetch_batches: int = 1
    crosses: str = "float32"
    decoder: str = "pil"
    object_store_bytes: int | None = None
    block_bytes: int | None = None
    locality_with_output: bool = False

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem:
            raise ConfigError(problem)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RayDataConfig:
        """From a JSON section or a Tune trial config (unknown keys refused)."""
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(
                f"unknown Ray Data keys {sorted(unknown)}; expected some of {sorted(known)}"
            )
        if "batch_size" not in values:
            raise ConfigError("the Ray Data section has no batch_size")
        return cls(**values)

    def values(self) -> dict[str, Any]:
        """Every field, by name (what :meth:`from_dict` takes)."""
        return asdict(self)

    def with_batch_size(self, batch_size: int) -> RayDataConfig:
        """This pipeline at another batch size."""
        return replace(self, batch_size=batch_size)

    @property
    def fixed(self) -> bool:
        """Whether the pool is fixed (min = max actors), not autoscaling."""
        return self.min_actors == self.max_actors

    @property
    def actor_cpus(self) -> float:
        """CPUs the actors reserve at most (the pool at its largest)."""
        return self.max_actors * self.cpus_per_actor

    @property
    def transfer(self) -> str:
        """The pipeline variant's ``transfer`` (as a
        :class:`~raytune_loader.candidates.config.LoaderConfig` names it)."""
        return "float32" if self.crosses == "float32" else "uint8"

    @property
    def decode(self) -> str:
        """The pipeline variant's ``decode``: the actors' decoder, or ``device``."""
        return "device" if self.crosses == "encoded" else self.decoder

    def candidate(self) -> LoaderConfig:
        """This pipeline as a candidate of the search (``engine="raydata"``)."""
        return LoaderConfig.from_raydata(self.values())

    def source_variant(self, access: str) -> LoaderConfig:
        """The DataLoader configuration the source is built with for this pipeline (its
        ``transfer`` and ``decode``, read by ``access``): the dataset whose files or rows
        the actors read (:func:`rows_of`)."""
        return LoaderConfig(self.batch_size, transfer=self.transfer, decode=self.decode,
                            access=access)  # fmt: skip

    def label(self) -> str:
        """Short form for tables and progress lines (the candidate's)."""
        return self.candidate().label()


def _problem(config: RayDataConfig) -> str | None:
    """The first thing wrong with ``config``, in one line, or None."""
    counts = {"batch_size": config.batch_size, "min_actors": config.min_actors,
              "max_actors": config.max_actors}  # fmt: skip
    for name, value in counts.items():
        if not _whole(value) or value < 1:
            return f"{name} must be an integer >= 1, got {value!r}"
    if config.max_actors < config.min_actors:
        return f"max_actors ({config.max_actors}) must be >= min_actors ({config.min_actors})"
    if isinstance(config.cpus_per_actor, bool) or not isinstance(
        config.cpus_per_actor, (int, float)
    ):
        return f"cpus_per_actor must be a number > 0, got {config.cpus_per_actor!r}"
    if not 0 < config.cpus_per_actor < math.inf:
        return f"cpus_per_actor must be a number > 0, got {config.cpus_per_actor!r}"
    optional = {
        "map_batch_size": config.map_batch_size,
        "object_store_bytes": config.object_store_bytes,
        "block_bytes": config.block_bytes,
    }
    for name, value in optional.items():
        if value is not None and (not _whole(value) or value < 1):
            return f"{name} must be an integer >= 1 or null (Ray's default), got {value!r}"
    if not _whole(config.prefetch_batches) or config.prefetch_batches < 0:
        return f"prefetch_batches must be an integer >= 0, got {config.prefetch_batches!r}"
    if config.crosses not in CROSSES:
        return f"crosses must be one of {', '.join(CROSSES)}, got {config.crosses!r}"
    if config.decoder not in CPU_DECODERS:
        return f"decoder must be one of {', '.join(CPU_DECODERS)}, got {config.decoder!r}"
    if config.crosses == "encoded" and config.decoder != "pil":
        return "crosses=encoded decodes on the device: leave decoder at pil (it is not used)"
    if not isinstance(config.locality_with_output, bool):
        return f"locality_with_output must be true or false, got {config.locality_with_output!r}"
    return None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def ray_docs_default(batch_size: int, max_actors: int) -> RayDataConfig:
    """The pipeline as Ray's documentation writes it, the Ray Data baseline: a callable
    class in ``map_batches`` with Ray's defaults (an autoscaling pool from one actor,
    unbounded: here up to ``max_actors``, what the trial may take; one CPU per actor; no
    ``batch_size``, so whole blocks), ``iter_torch_batches``' ``prefetch_batches=1``,
    the ``DataContext``'s defaults (128 MiB blocks, half the object store), and the
    torchvision transforms of Ray's image examples in the map (float32 crosses)."""
    return RayDataConfig(batch_size=batch_size, min_actors=1, max_actors=max_actors)
