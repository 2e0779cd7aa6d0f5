"""A finding: what the measurements say would break or slow training later, with its fix.

:mod:`~raytune_loader.verdict.findings` and :mod:`~raytune_loader.verdict.store_findings`
make them; ``best_config.json``'s ``findings`` list holds them (:meth:`Finding.as_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Finding:
    """One thing that would break or slow training later."""

    kind: str  # memory, threads, stragglers, epoch_start; spilled, actor_memory,
    # backpressure (Ray Data); throttled, small_objects, first_epoch (an object store)
    figure: str  # what was measured, in words
    fix: str
    projection: dict[str, Any] | None = None  # where it leads, for memory
    values: dict[str, Any] = field(default_factory=dict)  # the figures behind the words

    def as_dict(self) -> dict[str, Any]:
        """The finding as ``best_config.json``'s ``findings`` list holds it."""
        return {
            "kind": self.kind,
            "figure": self.figure,
            "projection": self.projection,
            "fix": self.fix,
            "values": self.values,
        }
