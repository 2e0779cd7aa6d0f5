"""The search space: :class:`SearchSpace`, valid by construction, and the baselines.

:class:`SearchSpace` turns the user's bounds into an Optuna define-by-run function
(:meth:`SearchSpace.define_by_run`) that proposes only candidates PyTorch and Ray accept
(each field suggested where its rule applies: :mod:`raytune_loader.candidates.rules`),
and into the baselines every search measures first (PyTorch's defaults, the rule of
thumb, Ray's documented pipeline). The same function, replayed, gives a candidate's
Optuna point (:meth:`SearchSpace.as_point`) and the whole grid
(:meth:`SearchSpace.grid`), so no second description of the space can drift from it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from raytune_loader.candidates.config import _DEFAULTS, LoaderConfig
from raytune_loader.candidates.rules import (
    ACTOR_CPUS,
    BLOCK_SIZES,
    ENGINES,
    MIN_ACTORS,
    OBJECT_STORE_BUDGETS,
    PREFETCH_BATCHES,
    PREFETCH_FACTORS,
    START_METHODS,
    TRANSFERS,
    WORKER_KINDS,
    WORKER_THREADS,
    applies,
    engine_fixes,
)
from raytune_loader.candidates.structure import Structure, structure
from raytune_loader.errors import ConfigError

PYTORCH_DEFAULT = "pytorch-default"


HEURISTIC = "heuristic"


RANK_SHARE = "heuristic-rank-share"  # with several ranks: min(usable CPUs // ranks, 8) each


RAY_DOCS = "ray-docs-default"  # the Ray Data baseline: the pipeline as Ray's docs write it


_COUNTED = ("num_workers", "max_actors")  # suggested as integers in a range

TRAINERS = ("hf",)  # trainers that build the loader themselves from a few arguments
# what a trainer's own loader cannot take, by trainer: the space does not offer it
LEFT_OUT = {
    "hf": {
        "engine": "Ray Data (the Trainer builds a DataLoader)",
        "workers": "thread workers (TrainingArguments starts worker processes)",
        "decode": "decoding on the device (the Trainer hands batches to the model as made)",
        "transfer": "uint8 batches finished on the device (the same: the model gets them as made)",
        "worker_threads": "worker_threads (the Trainer sets its own worker_init_fn)",
        "batching": "batches made in the workers (the Trainer's DataLoader batches)",
        "in_order": "in_order=False (dataloader_in_order is transformers 5's alone)",
        "multiprocessing_context": "a start method (dataloader_multiprocessing_context is "
        "transformers 5's alone)",
    },
}


@dataclass(frozen=True)
class SearchSpace:
    """Bounds of the search, turned into an Optuna define-by-run function."""

    max_workers: int
    batch_sizes: tuple[int, ...]
    cuda: bool
    usable_cpus: int
    prefetch_factors: tuple[int, ...] = field(default=PREFETCH_FACTORS)
    pipeline: bool = False  # the dataset's pipeline is searched too (built-in image data)
    decodes: tuple[str, ...] = ("pil",)  # where JPEGs may be decoded (built-in image data)
    thread_workers: bool = False  # thread workers are a candidate too
    ranks: int = 1  # data-parallel ranks per trial; the configuration is per rank
    accesses: tuple[str, ...] = ("map",)  # how the source may be read: by index, as a stream
    batchings: tuple[str, ...] = ("loader",)  # where a stream's batches may be made
    stream_workers: int | None = None  # the most workers a rank's stream keeps busy
    raydata_cpus: float = 0.0  # CPUs a Ray Data candidate's actors may take (0: none offered)
    locality_works: bool = False  # Ray honours locality_with_output (2.60 does not)
    fetch_threads: tuple[int, ...] = (1,)  # a batch's objects in flight per worker (a store's)
    caches: tuple[bool, ...] = (False,)  # (False, True): a bucket's epoch fits a local cache
    trainer: str | None = None  # a trainer that builds the loader itself (LEFT_OUT: not offered)

    def __post_init__(self) -> None:
        if self.trainer is not None and self.trainer not in TRAINERS:
            raise ConfigError(f"--trainer must be one of {', '.join(TRAINERS)}, got {self.trainer}")
        if "device" in self.decodes and not self.cuda:
            raise ConfigError("decoding on the device needs CUDA")
        if self.max_workers < 0:
            raise ConfigError(f"--max-workers must be >= 0, got {self.max_workers}")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ConfigError(f"batch sizes must be positive integers, got {self.batch_sizes}")
        if not self.fetch_threads or min(self.fetch_threads) < 1:
            raise ConfigError(f"fetch threads must be positive integers, got {self.fetch_threads}")
        if self.raydata_cpus < 0:
            raise ConfigError(f"--remote-cpus must be >= 0, got {self.raydata_cpus:g}")

    @property
    def raydata(self) -> bool:
        """Whether Ray Data candidates are offered: their actors have a CPU to take."""
        return self.raydata_cpus >= 1

    @property
    def actor_cpu_choices(self) -> tuple[float, ...]:
        """CPUs per actor the space offers: those of :data:`ACTOR_CPUS` the actors' CPUs
        hold."""
        return tuple(c for c in ACTOR_CPUS if c <= self.raydata_cpus)

    def most_actors(self, cpus_per_actor: float) -> int:
        """The largest pool of actors of ``cpus_per_actor`` the actors' CPUs hold."""
        return max(1, int(self.raydata_cpus / cpus_per_actor + 1e-9))

    @property
    def map_batch_sizes(self) -> tuple[int | None, ...]:
        """Rows of one map call: whole blocks (Ray's default), a quarter of the training
        batch, or one training batch (larger calls only lengthen what each actor holds)."""
        batch = self.baseline_batch_size
        return tuple(dict.fromkeys((None, max(1, batch // 4), batch)))

    def unrestricted(self) -> SearchSpace:
        """This space without its trainer's limits: what the profile measures, so that the
        report can say what the limits cost."""
        return replace(self, trainer=None)

    def constants(self) -> dict[str, Any]:
        """Values the space fixes rather than searches (a single batch size, a stream)."""
        fixed: dict[str, Any] = {}
        if len(self.batch_sizes) == 1:
            fixed["batch_size"] = self.batch_sizes[0]
        if self.accesses == ("stream",):
            fixed["access"] = "stream"
        return fixed

    def define_by_run(self, trial: Any) -> dict[str, Any] | None:
        """Optuna define-by-run space; returns the constants that are not searched. Each
        field the space searches is suggested where its rule applies (:data:`RULES`)
        given the answers before it, so every proposal is a valid candidate."""
        values = {**_DEFAULTS, "access": self.accesses[0]}
        left_out = LEFT_OUT.get(self.trainer or "", {})
        for name, choices in self._searched(values):
            if name == "decode" and "decode" in left_out and choices:
                choices = [c for c in choices if c != "device"]
                choices = choices if len(choices) > 1 else None
            elif name in left_out:
                continue  # the trainer's loader cannot take it: its default stays
            if not choices or not applies(name, values):
                continue
            if name in _COUNTED:
                values[name] = trial.suggest_int(name, choices[0], choices[-1])
            else:
                values[name] = trial.suggest_categorical(name, choices)
        return self.constants() or None

    def _searched(self, values: dict[str, Any]) -> Iterator[tuple[str, list[Any] | None]]:
        """The fields this space searches, in the order they are suggested (a field after
        those its rule reads), each with its choices (None: not searched here)."""
        yield "engine", list(ENGINES) if self.raydata else None
        values.update(engine_fixes(values["engine"]))
        yield "access", list(self.accesses) if len(self.accesses) > 1 else None
        most = self.max_workers  # a stream's workers share its shards: no more than them
        if values["access"] == "stream" and self.stream_workers is not None:
            most = min(most, self.stream_workers)
        yield "num_workers", list(range(0, most + 1))
        yield "fetch_threads", list(self.fetch_threads) if len(self.fetch_threads) > 1 else None
        yield "cache", list(self.caches) if len(self.caches) > 1 else None
        yield "batching", list(self.batchings) if len(self.batchings) > 1 else None
        yield "decode", list(self.decodes) if self.pipeline and len(self.decodes) > 1 else None
        yield "workers", list(WORKER_KINDS) if self.pipeline and self.thread_workers else None
        yield "prefetch_factor", list(self.prefetch_factors)
        yield "persistent_workers", [True, False]
        yield "worker_threads", list(WORKER_THREADS)
        yield "in_order", [True, False] if self.pipeline else None
        yield "multiprocessing_context", list(START_METHODS) if self.pipeline else None
        yield "pin_memory", [True, False] if self.cuda else None
        yield "batch_size", list(self.batch_sizes) if len(self.batch_sizes) > 1 else None
        yield "transfer", list(TRANSFERS) if self.pipeline else None
        yield "cpus_per_actor", list(self.actor_cpu_choices)
        cpus = values["cpus_per_actor"] or 1.0
        yield "max_actors", list(range(1, self.most_actors(cpus) + 1))
        yield "min_actors", list(MIN_ACTORS)
        yield "map_batch_size", list(self.map_batch_sizes)
        yield "prefetch_batches", list(PREFETCH_BATCHES)
        yield "object_store_bytes", list(OBJECT_STORE_BUDGETS)
        yield "block_bytes", list(BLOCK_SIZES)
        yield "locality_with_output", [False, True] if self.locality_works else None

    @property
    def baseline_access(self) -> str:
        """How the baselines read the data: by index where the source allows it."""
        return "map" if "map" in self.accesses else self.accesses[0]

    @property
    def baseline_batch_size(self) -> int:
        """The batch size the baselines train at: the first the space offers."""
        return self.batch_sizes[0]

    def baselines(self) -> dict[str, LoaderConfig]:
        """The configurations every search measures first, by name: PyTorch's defaults
        and the rule of thumb, per rank as people apply it (with several ranks it is
        not held to the space's per-rank bound), and with several ranks the rule of
        thumb on each rank's share of the CPUs."""
        ranks = self.ranks > 1
        rule = self._heuristic_rule if ranks else min(self._heuristic_rule, self.max_workers)
        found = {
            PYTORCH_DEFAULT: LoaderConfig(
                batch_size=self.baseline_batch_size, access=self.baseline_access
            ),  # fmt: skip
            HEURISTIC: self._rule_of_thumb(min(rule, self._stream_bound)),
        }
        share = self._rule_of_thumb(min(self.usable_cpus // self.ranks, 8, self._stream_bound))
        if ranks and share != found[HEURISTIC]:  # a node of 8+ CPUs a rank: the same loader
            found[RANK_SHARE] = share
        if self.raydata:
            found[RAY_DOCS] = self.ray_docs_default
        return found

    @property
    def ray_docs_default(self) -> LoaderConfig:
        """The Ray Data baseline: the pipeline as Ray's documentation writes it (a
        callable class in ``map_batches``: an autoscaling pool from one actor, here up to
        what a trial may take, one CPU each, whole blocks; ``prefetch_batches=1``; the
        ``DataContext``'s defaults; float32 images decoded with PIL), the field defaults
        of every Ray Data knob (:func:`raytune_loader.raydata.config.ray_docs_default` is the
        same pipeline, checked against the installed Ray)."""
        values = {"engine": "raydata", "max_actors": self.most_actors(1.0), "min_actors": 1}
        return LoaderConfig.from_dict(values, batch_size=self.baseline_batch_size)

    def _rule_of_thumb(self, workers: int) -> LoaderConfig:
        return LoaderConfig.from_dict(
            {
                "num_workers": workers,
                "prefetch_factor": 2 if workers else None,
                "pin_memory": self.cuda,
                "persistent_workers": workers > 0,
                "access": self.baseline_access,
            },
            batch_size=self.baseline_batch_size,
        )

    @property
    def _stream_bound(self) -> int:
        """The most workers the baselines' stream keeps busy (a stream that does not
        split yields the same samples in every worker: more would read duplicates)."""
        if self.baseline_access == "stream" and self.stream_workers is not None:
            return self.stream_workers
        return self._heuristic_rule

    @property
    def _heuristic_rule(self) -> int:
        """The rule of thumb's worker count: min(usable CPUs, 8)."""
        return min(self.usable_cpus, 8)

    @property
    def heuristic_note(self) -> str | None:
        """Why the heuristic has fewer workers than the rule of thumb, if it does; with
        several ranks, that the rule of thumb applied per rank overfills the node."""
        if self._stream_bound < self._heuristic_rule:
            return (
                f"num_workers is {self._stream_bound}, the most workers the stream keeps "
                f"busy, below the rule of thumb min(usable CPUs, 8) = {self._heuristic_rule}"
            )
        if self.ranks > 1:
            wanted = self.ranks * (1 + self._heuristic_rule)
            if wanted <= self.usable_cpus:
                return None
            return (
                f"{self.ranks} ranks x (1 + {self._heuristic_rule} workers) = {wanted} "
                f"processes on {self.usable_cpus} usable CPUs: its reservation is capped at "
                "the node, and its workers share the cores"
            )
        if self.max_workers >= self._heuristic_rule:
            return None
        return (
            f"num_workers is --max-workers {self.max_workers}, below the rule of thumb "
            f"min(usable CPUs, 8) = {self._heuristic_rule}"
        )

    def as_point(self, config: LoaderConfig) -> dict[str, Any]:
        """The parameters Optuna would suggest for ``config`` (for enqueuing it): the
        space itself, replayed with ``config``'s values as the answers."""
        replay = _Replay(config)
        self.define_by_run(replay)
        return replay.point

    def choices_of(self, config: LoaderConfig) -> dict[str, tuple[Any, ...]]:
        """For each parameter of :meth:`as_point`, what the space offered it there: an
        integer's ``("int", low, high)``, a choice's ``("choice", *choices)``."""
        replay = _Replay(config)
        self.define_by_run(replay)
        return replay.offered

    def grid(self) -> list[LoaderConfig]:
        """Every configuration of the space: the branches of :meth:`define_by_run`,
        walked one suggestion at a time (once per space: it grows with the cores)."""
        return list(_grid(self))

    def _walk(self) -> tuple[LoaderConfig, ...]:
        found: list[LoaderConfig] = []
        pending: list[list[Any]] = [[]]
        while pending:
            answers = pending.pop()
            walker = _Walk(answers)
            try:
                constants = self.define_by_run(walker) or {}
            except _Branch as branch:
                pending.extend([*answers, choice] for choice in reversed(branch.choices))
                continue
            found.append(LoaderConfig.from_dict({**walker.params, **constants}))
        return tuple(found)

    def structures(self) -> dict[Structure, list[LoaderConfig]]:
        """The space's configurations by :func:`structure`; configurations without
        workers are a structure of their own per decoder and transfer."""
        found: dict[Structure, list[LoaderConfig]] = {}
        for config in self.grid():
            found.setdefault(structure(config), []).append(config)
        return found

    def baseline_name(self, config: LoaderConfig) -> str | None:
        """The baseline's name ``config`` is (``pytorch-default``, ``heuristic``...), or None."""
        for name, baseline in self.baselines().items():
            if baseline == config:
                return name
        return None


class _Replay:
    """Stands in for an Optuna trial: each suggestion is answered with ``config``'s value
    and recorded, so the space's own branches say which parameters ``config`` sets."""

    def __init__(self, config: LoaderConfig) -> None:
        self.values = config.values()
        self.point: dict[str, Any] = {}
        self.offered: dict[str, tuple[Any, ...]] = {}

    def suggest_int(self, name: str, low: int, high: int) -> Any:
        self.offered[name] = ("int", low, high)
        return self._answer(name)

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        self.offered[name] = ("choice", *choices)
        return self._answer(name)

    def _answer(self, name: str) -> Any:
        self.point[name] = self.values[name]
        return self.point[name]


@functools.lru_cache(maxsize=4)
def _grid(space: SearchSpace) -> tuple[LoaderConfig, ...]:
    return space._walk()


class _Branch(Exception):
    def __init__(self, choices: list[Any]) -> None:
        self.choices = choices


class _Walk:
    """Stands in for an Optuna trial that answers with ``answers`` in order, and at the
    first suggestion beyond them says which choices it has (:meth:`SearchSpace.grid`)."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.params: dict[str, Any] = {}

    def suggest_int(self, name: str, low: int, high: int) -> Any:
        return self._answer(name, list(range(low, high + 1)))

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        return self._answer(name, list(choices))

    def _answer(self, name: str, choices: list[Any]) -> Any:
        if len(self.params) == len(self.answers):
            raise _Branch(choices)
        self.params[name] = self.answers[len(self.params)]
        return self.params[name]
