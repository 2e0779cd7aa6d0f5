"""What a candidate is built of: :class:`Structure`.

Apart from its counts (workers, prefetch, batch size), a candidate is its decoder, its
transfer, its kind of workers, how it is read and batched. The space is covered,
profiled, modelled and reported by structure (:func:`structure`).
"""

from __future__ import annotations

from dataclasses import dataclass

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.candidates.rules import applies


@dataclass(frozen=True)
class Structure:
    """What a configuration is built of, apart from its counts (workers, prefetch, batch
    size): the decoder, the transfer, the worker kind (``none`` without workers), how
    it is read and batched. The space is covered, profiled, modelled and reported by
    structure (:func:`structure`)."""

    decode: str
    transfer: str
    kind: str  # process, thread, none, or raydata (Ray Data's actors)
    access: str
    batching: str

    @property
    def worker_side(self) -> str:
        """The key of what a worker does to a sample (the profile's per-core cost):
        decoder/transfer, and for a stream how it is read and batched."""
        key = f"{self.decode}/{self.transfer}"
        return f"{key}/stream/{self.batching}" if self.access == "stream" else key

    @property
    def remote(self) -> bool:
        """Its batches are made beyond the trial's processes, by Ray Data's actors."""
        return self.kind == "raydata"

    @property
    def receiving(self) -> str:
        """The key of what the training process receives a batch from: kind/transfer
        (the loop itself, without workers, counts as a process; Ray Data's actors
        through the object store, ``raydata``)."""
        return f"{'process' if self.kind == 'none' else self.kind}/{self.transfer}"

    def words(self) -> str:
        """For tables: ``tensor, uint8, threads``."""
        kind = {"none": "no workers", "process": "processes", "thread": "threads",
                "raydata": "Ray Data actors"}[self.kind]  # fmt: skip
        read = ", stream" + (" batched in workers" if self.batching == "workers" else "")
        return f"{self.decode}, {self.transfer}, {kind}" + (read if self.access == "stream" else "")


def structure(config: LoaderConfig) -> Structure:
    """``config``'s structure."""
    kind = config.workers if applies("workers", config.values()) else "none"
    if config.engine == "raydata":
        kind = "raydata"
    return Structure(config.decode, config.transfer, kind, config.access, config.batching)
