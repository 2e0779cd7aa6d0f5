"""The engine contract: who makes a candidate's batches, and what that means for the rest.

A candidate (:class:`~raytune_loader.candidates.config.LoaderConfig`) names its engine;
:func:`raytune_loader.engines.engine_of` turns it into an :class:`Engine`, once, and every
step that would otherwise ask "is this a Ray Data candidate?" asks the engine instead:
what it reserves, how it builds the batches a segment reads, what it holds in flight (the
drain before the window), what its segment watches, and how ``best_config.json`` writes
it and reads it back. Each abstract method says when it is called; a subclass that
forgets one cannot be instantiated (Python names the missing method).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from torch.utils.data import Dataset

    from raytune_loader.candidates.config import LoaderConfig


@dataclass(frozen=True)
class Held:
    """What a candidate holds ahead of the training loop on the trial's node: ``host``
    bytes in host memory and ``shm`` bytes in ``/dev/shm``, held by its ``holder`` (the
    words a refusal uses), whose ``fix`` a refusal for ``/dev/shm`` suggests."""

    host: int
    shm: int
    holder: str
    fix: str


@dataclass(frozen=True)
class Verdict:
    """What the search found of an engine's best verified candidate, for its section of
    ``best_config.json`` (:meth:`Engine.section`): whether it was ``chosen``, its
    ``name`` and ``metrics``, its speedup over the DataLoader written beside it, the
    CPUs the trial took and the CPUs the space offered its makers of batches, the
    makers' CPUs the cost model says reach the ceiling (None without the model), and
    its ``findings`` (each as its JSON object)."""

    chosen: bool
    name: str
    metrics: dict[str, Any]
    speedup_vs_dataloader: float | None
    trial_cpus: float
    offered_cpus: float
    cpus_to_ceiling: float | None
    findings: list[dict[str, Any]]


class SegmentWatch(Protocol):
    """What an engine watches beyond the loop's own figures while a segment runs."""

    def window_started(self) -> None:
        """Called when the measured window starts."""

    def window_ended(self) -> None:
        """Called when the measured window ends."""

    def figures(self) -> dict[str, Any]:
        """Figures by :class:`~raytune_loader.measuring.outcomes.SegmentMetrics`' names."""
        ...


class Engine(abc.ABC):
    """One candidate's engine. ``name`` is its value of ``LoaderConfig.engine``;
    ``remote`` says its batches are made by processes of the cluster beyond the trial's
    own (their CPUs reserved in bundles of their own): such a candidate is measured with
    one rank per trial, its receiving costs timed from one of them, and verified beside
    the DataLoaders; ``whole`` says its segment's figures need the segment's epoch read
    to its end (Ray Data's own figures of an execution), so its drain and window are
    never cut short; ``columns`` are the configuration's fields that mean something for
    it (tables show them); ``use`` is the line that tells a user how to train with it."""

    name: ClassVar[str]
    remote: ClassVar[bool]
    whole: ClassVar[bool] = False
    columns: ClassVar[tuple[str, ...]]
    use: ClassVar[str]

    def __init__(self, config: LoaderConfig) -> None:
        self.config = config

    # what it reserves --------------------------------------------------------------------

    @abc.abstractmethod
    def bundles(self, pin: str | None) -> list[dict[str, float]]:
        """Called when a measurement's Ray resources are made: the bundles its makers of
        batches take beside the trial's own (on nodes carrying ``pin``, a custom
        resource, when given); empty where they run in the trial's own bundle."""

    # how it builds its batches -----------------------------------------------------------

    @abc.abstractmethod
    def source_variant(self, accesses: tuple[str, ...]) -> LoaderConfig:
        """Called before a measurement builds its dataset: the configuration whose
        worker side the source is built with, read by one of ``accesses`` (the
        source's ways to be read)."""

    @abc.abstractmethod
    def segment_loader(
        self, dataset: Dataset[Any], samples: int, seed: int, timeout_s: float
    ) -> AbstractContextManager[Iterable[Any]]:
        """Called by a measured segment: the candidate over ``dataset`` as one epoch of
        ``samples``, every batch stamped
        (:class:`~raytune_loader.loaders.batches.Stamped`); its workers or actors end
        when the block ends, however it ends."""

    # what it holds in flight -------------------------------------------------------------

    @abc.abstractmethod
    def in_flight(self) -> int:
        """Called to size the drain before a window: batches the candidate can hold at
        once besides the one the loop trains on."""

    @abc.abstractmethod
    def producers(self) -> int:
        """Called by the steady rate: how many makers of batches run at once."""

    @abc.abstractmethod
    def held(self, sample_bytes: int) -> Held:
        """Called before a trial starts, to refuse what would not fit: the bytes its
        batches in flight take in host memory and ``/dev/shm``."""

    # what its segment watches ------------------------------------------------------------

    @abc.abstractmethod
    def segment_watch(self, loader: Any) -> SegmentWatch | None:
        """Called when a segment starts, with the loader :meth:`segment_loader` gave:
        what it watches beyond the loop's figures, or None."""

    # how best_config.json writes and rebuilds it -----------------------------------------

    @abc.abstractmethod
    def settings(self) -> dict[str, Any]:
        """Called when ``best_config.json`` lists a candidate (a runner-up, a baseline):
        its settings as the file names them."""

    @abc.abstractmethod
    def section(self, verdict: Verdict) -> dict[str, Any]:
        """Called when ``best_config.json`` is written, on the engine of each engine's
        best verified candidate: the file's top-level section for it, keyed by
        :attr:`name` (its settings, what it reserved, and ``verdict``); empty where the
        file's own ``loader`` sections hold it."""

    @classmethod
    @abc.abstractmethod
    def read_section(cls, data: Mapping[str, Any]) -> Any:
        """Called when ``best_config.json`` is read: the pipeline that :meth:`section`
        wrote into ``data`` (the file's content), validated without importing what runs
        it (a ConfigError saying what is wrong); None where the file has none."""

    @classmethod
    @abc.abstractmethod
    def summary_lines(cls, data: Mapping[str, Any]) -> list[str]:
        """Called when a search's summary is printed: what the engine's section of
        ``best_config.json`` (:meth:`section`, in ``data``) says beside the table; none
        where the file has no section of its own."""

    @classmethod
    @abc.abstractmethod
    def from_settings(cls, section: Mapping[str, Any]) -> LoaderConfig | None:
        """Called when ``best_config.json`` is read back: the candidate a section
        (:meth:`settings`' keys) describes, or None where the section is not this
        engine's."""
