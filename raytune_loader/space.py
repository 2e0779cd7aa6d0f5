"""The search space: candidate DataLoader configurations and what each one costs.

A :class:`LoaderConfig` is one candidate. :class:`SearchSpace` turns the user's
bounds into an Optuna define-by-run function that only proposes combinations
PyTorch accepts (``prefetch_factor`` and ``persistent_workers`` only with
workers, ``pin_memory`` only with CUDA), and into the two baselines every search
measures first. :func:`reserved_cpus` is the one formula for a trial's Ray
reservation.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from raytune_loader.errors import ConfigError

PYTORCH_DEFAULT = "pytorch-default"
HEURISTIC = "heuristic"
RANK_SHARE = "heuristic-rank-share"  # with several ranks: min(usable CPUs // ranks, 8) each
PREFETCH_FACTORS = (1, 2, 4, 8)
TRANSFERS = ("float32", "uint8")  # float32 normalized in the workers, or uint8 to the device
DECODES = ("pil", "tensor", "device")  # JPEGs decoded in the workers to PIL images or to
# tensors (both libjpeg-turbo), or on the device with nvJPEG, batched (CUDA only)
WORKER_KINDS = ("process", "thread")  # DataLoader worker processes, or torchdata threads
ACCESSES = ("map", "stream")  # samples by index (a sampler), or an IterableDataset's stream
BATCHINGS = ("loader", "workers")  # a stream's batches made by the DataLoader, or by the
# dataset's own pipeline in each worker (webdataset's .batched(); DataLoader batch_size=None)
START_METHODS = (None, "forkserver", "spawn")  # None: the platform's default (fork on Linux)
WORKER_THREADS = (None, 1)  # each worker's BLAS/OpenMP/torch threads: the libraries' own, or 1


def _knob(default: Any, label: str, role: str = "loader", shown_as: str | None = None) -> Any:
    """A field of :class:`LoaderConfig`: a DataLoader argument (``role="loader"``), a
    stage of the pipeline around it (``"pipeline"``), or a setting each worker process
    applies when it starts (``"worker"``: the tuned loader's ``worker_init_fn`` sets it,
    in every dataset's search, where the pipeline section is only written for the
    datasets whose pipeline is searched); ``label`` heads its column in tables;
    ``shown_as`` also lists a DataLoader argument in the JSON's ``pipeline`` section
    under that name. Every list of keys below is derived from these."""
    return field(default=default, metadata={"label": label, "role": role, "shown_as": shown_as})


@dataclass(frozen=True)
class LoaderConfig:
    """One candidate: the DataLoader keyword arguments the search tunes, and how the
    input pipeline around the loader is built (not DataLoader arguments, see
    :meth:`pipeline`): ``transfer``, the images' dtype on the way to the device;
    ``decode``, where JPEGs are decoded; ``workers``, processes or threads. With
    ``decode="device"`` the workers only read the files, the encoded bytes cross,
    and decoding, cropping and normalizing happen on the device (``transfer`` is
    then ``uint8``: the images reach float32 there). ``worker_threads`` is not a
    DataLoader argument either: ``None`` leaves the thread pools of BLAS, OpenMP and
    torch in each worker process at the libraries' defaults, ``1`` holds each to one
    thread (:func:`raytune_loader.loader.build_dataloader` applies it in the workers)."""

    batch_size: int = field(metadata={"label": "batch", "role": "loader", "shown_as": None})
    num_workers: int = _knob(0, "workers")
    prefetch_factor: int | None = _knob(None, "prefetch")
    pin_memory: bool = _knob(False, "pin")
    persistent_workers: bool = _knob(False, "persistent")
    in_order: bool = _knob(True, "in order", shown_as="in_order")
    multiprocessing_context: str | None = _knob(None, "start method", shown_as="start_method")
    transfer: str = _knob("float32", "transfer", role="pipeline")
    decode: str = _knob("pil", "decode", role="pipeline")
    workers: str = _knob("process", "worker kind", role="pipeline")
    access: str = _knob("map", "access", role="pipeline")
    batching: str = _knob("loader", "batching", role="pipeline")
    worker_threads: int | None = _knob(None, "worker threads", role="worker")

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool):
            raise ConfigError(f"batch_size must be an integer, got {self.batch_size!r}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be positive, got {self.batch_size}")
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ConfigError(f"num_workers must be an integer >= 0, got {self.num_workers!r}")
        if self.num_workers == 0 and (self.prefetch_factor is not None or self.persistent_workers):
            raise ConfigError(
                "prefetch_factor and persistent_workers need num_workers > 0 "
                f"(got num_workers=0, prefetch_factor={self.prefetch_factor}, "
                f"persistent_workers={self.persistent_workers})"
            )
        if self.prefetch_factor is not None and (
            not isinstance(self.prefetch_factor, int) or self.prefetch_factor < 1
        ):
            raise ConfigError(
                f"prefetch_factor must be a positive integer, got {self.prefetch_factor!r}"
            )
        for name in ("pin_memory", "persistent_workers", "in_order"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.multiprocessing_context not in START_METHODS + ("fork",):
            raise ConfigError(
                f"multiprocessing_context must be fork, forkserver or spawn, "
                f"got {self.multiprocessing_context!r}"
            )
        if self.num_workers == 0 and (self.multiprocessing_context or not self.in_order):
            raise ConfigError("multiprocessing_context and in_order need num_workers > 0")
        if self.transfer not in TRANSFERS:
            raise ConfigError(f"transfer must be one of {', '.join(TRANSFERS)}")
        if self.decode not in DECODES:
            raise ConfigError(f"decode must be one of {', '.join(DECODES)}")
        if self.decode == "device" and self.transfer != "uint8":
            raise ConfigError("decode=device finishes the images on the device: transfer uint8")
        if self.workers not in WORKER_KINDS:
            raise ConfigError(f"workers must be one of {', '.join(WORKER_KINDS)}")
        if self.access not in ACCESSES or self.batching not in BATCHINGS:
            raise ConfigError(
                f"access must be one of {', '.join(ACCESSES)} and batching one of "
                f"{', '.join(BATCHINGS)}, got {self.access!r} and {self.batching!r}"
            )
        if self.batching == "workers" and self.access != "stream":
            raise ConfigError("batching in the workers is a choice of streams (access stream)")
        if self.workers == "thread" and (
            self.num_workers == 0 or self.multiprocessing_context or self.persistent_workers
        ):
            raise ConfigError(
                "thread workers need num_workers > 0 and take neither a "
                "multiprocessing_context nor persistent_workers (threads cost nothing to keep)"
            )
        self._check_worker_threads()

    def _check_worker_threads(self) -> None:
        if self.worker_threads is None:
            return
        threads = self.worker_threads
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ConfigError(
                f"worker_threads must be a positive integer or null, got {self.worker_threads!r}"
            )
        if self.num_workers == 0 or self.workers != "process":
            raise ConfigError(
                "worker_threads limits the thread pools of worker processes: it needs "
                "num_workers > 0 and process workers (thread workers share the training "
                "process's pools, and limiting them would limit the training step too)"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any], batch_size: int | None = None) -> LoaderConfig:
        """Build from a Tune trial config or a JSON ``loader`` section (with the
        ``pipeline`` and ``worker_init`` sections' keys merged in), validating types."""
        known = set(CONFIG_KEYS)
        unknown = set(values) - known
        if unknown:
            raise ConfigError(
                f"unknown loader keys {sorted(unknown)}; expected some of {sorted(known)}"
            )
        merged = {"batch_size": batch_size, **values}
        if merged["batch_size"] is None:
            raise ConfigError("loader config has no batch_size")
        workers = merged.get("num_workers", 0)
        if workers == 0:
            merged["prefetch_factor"] = None
            merged["persistent_workers"] = False
            merged["in_order"] = True
            merged["multiprocessing_context"] = None
            merged["workers"] = "process"
            merged["worker_threads"] = None
        elif merged.get("prefetch_factor") is None:
            merged["prefetch_factor"] = 2
        if merged.get("workers") == "thread":
            merged["multiprocessing_context"] = None
            merged["persistent_workers"] = False
            merged["worker_threads"] = None
        if merged.get("decode") == "device":
            merged["transfer"] = "uint8"
        if merged.get("access", "map") == "map":
            merged["batching"] = "loader"  # a map-style loader batches in its workers anyway
        return cls(**merged)

    @classmethod
    def from_trial_config(cls, config: dict[str, Any]) -> LoaderConfig:
        """From a Tune trial config or a trials.csv row, ignoring the other keys."""
        return cls.from_dict({k: v for k, v in config.items() if k in CONFIG_KEYS})

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.utils.data.DataLoader``."""
        return {k: v for k, v in asdict(self).items() if k in LOADER_KEYS}

    def pipeline(self) -> dict[str, Any]:
        """How the pipeline around the DataLoader is built (``best_config.json``'s
        ``pipeline`` section): the pipeline stages, and the DataLoader arguments that
        shape it (``in_order``, the start method: ``default`` for the platform's)."""
        out = {k: getattr(self, k) for k in PIPELINE_KEYS}
        for name, shown_as in SHOWN_IN_PIPELINE.items():
            value = getattr(self, name)
            out[shown_as] = "default" if name == "multiprocessing_context" and not value else value
        return out

    def worker_init(self) -> dict[str, Any]:
        """What each worker process sets when it starts (``best_config.json``'s
        ``worker_init`` section)."""
        return {k: getattr(self, k) for k in WORKER_KEYS}

    def values(self) -> dict[str, Any]:
        """Every field, DataLoader arguments, pipeline stages, then worker settings
        (trials.csv's columns)."""
        return {k: getattr(self, k) for k in CONFIG_KEYS}

    def with_batch_size(self, batch_size: int) -> LoaderConfig:
        return LoaderConfig(**{**asdict(self), "batch_size": batch_size})

    def label(self) -> str:
        """Short human-readable form for tables and progress lines."""
        extra = " uint8" if self.transfer == "uint8" and self.decode != "device" else ""
        extra += {"pil": "", "tensor": " tensor-decode", "device": " device-decode"}[self.decode]
        extra += " stream" if self.access == "stream" else ""
        extra += " batched-in-workers" if self.batching == "workers" else ""
        if self.num_workers == 0:
            return f"workers=0 pin={_yn(self.pin_memory)} bs={self.batch_size}{extra}"
        extra += " threads" if self.workers == "thread" else ""
        extra += "" if self.in_order else " unordered"
        extra += f" {self.multiprocessing_context}" if self.multiprocessing_context else ""
        extra += f" worker-threads={self.worker_threads}" if self.worker_threads else ""
        return (
            f"workers={self.num_workers} prefetch={self.prefetch_factor} "
            f"pin={_yn(self.pin_memory)} persistent={_yn(self.persistent_workers)} "
            f"bs={self.batch_size}{extra}"
        )


CONFIG_KEYS = tuple(f.name for f in fields(LoaderConfig))
LOADER_KEYS = tuple(f.name for f in fields(LoaderConfig) if f.metadata["role"] == "loader")
PIPELINE_KEYS = tuple(f.name for f in fields(LoaderConfig) if f.metadata["role"] == "pipeline")
WORKER_KEYS = tuple(f.name for f in fields(LoaderConfig) if f.metadata["role"] == "worker")
LABELS = {f.name: f.metadata["label"] for f in fields(LoaderConfig)}
SHOWN_IN_PIPELINE = {f.name: f.metadata["shown_as"] for f in fields(LoaderConfig)
                     if f.metadata["shown_as"]}  # fmt: skip


def _yn(flag: bool) -> str:
    return "y" if flag else "n"


def reserved_cpus(
    num_workers: int, cpus_per_worker: float, node_cpus: float, ranks: int = 1
) -> float:
    """CPUs a trial reserves: each of its ranks plus that rank's workers, never more than
    the node has."""
    return min(ranks * (1 + cpus_per_worker * num_workers), node_cpus)


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

    def __post_init__(self) -> None:
        if "device" in self.decodes and not self.cuda:
            raise ConfigError("decoding on the device needs CUDA")
        if self.max_workers < 0:
            raise ConfigError(f"--max-workers must be >= 0, got {self.max_workers}")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ConfigError(f"batch sizes must be positive integers, got {self.batch_sizes}")

    def constants(self) -> dict[str, Any]:
        """Values the space fixes rather than searches (a single batch size, a stream)."""
        fixed: dict[str, Any] = {}
        if len(self.batch_sizes) == 1:
            fixed["batch_size"] = self.batch_sizes[0]
        if self.accesses == ("stream",):
            fixed["access"] = "stream"
        return fixed

    def define_by_run(self, trial: Any) -> dict[str, Any] | None:
        """Optuna define-by-run space; returns the constants that are not searched."""
        access = self.accesses[0]
        if len(self.accesses) > 1:
            access = trial.suggest_categorical("access", list(self.accesses))
        most = self.max_workers  # a stream's workers share its shards: no more than them
        if access == "stream" and self.stream_workers is not None:
            most = min(most, self.stream_workers)
        workers = trial.suggest_int("num_workers", 0, most)
        if access == "stream" and len(self.batchings) > 1:
            trial.suggest_categorical("batching", list(self.batchings))
        decode = "pil"
        if self.pipeline and len(self.decodes) > 1:
            decode = trial.suggest_categorical("decode", list(self.decodes))
        if workers > 0:
            kind = "process"
            if self.pipeline and self.thread_workers:
                kind = trial.suggest_categorical("workers", list(WORKER_KINDS))
            trial.suggest_categorical("prefetch_factor", list(self.prefetch_factors))
            if kind == "process":
                trial.suggest_categorical("persistent_workers", [True, False])
                trial.suggest_categorical("worker_threads", list(WORKER_THREADS))
            if self.pipeline:
                trial.suggest_categorical("in_order", [True, False])
                if kind == "process":
                    trial.suggest_categorical("multiprocessing_context", list(START_METHODS))
        if self.cuda:
            trial.suggest_categorical("pin_memory", [True, False])
        if len(self.batch_sizes) > 1:
            trial.suggest_categorical("batch_size", list(self.batch_sizes))
        if self.pipeline and decode != "device":
            trial.suggest_categorical("transfer", list(TRANSFERS))
        return self.constants() or None

    @property
    def baseline_access(self) -> str:
        """How the baselines read the data: by index where the source allows it."""
        return "map" if "map" in self.accesses else self.accesses[0]

    @property
    def baseline_batch_size(self) -> int:
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
        return found

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

    def structures(self) -> dict[tuple[str, ...], list[LoaderConfig]]:
        """The space's configurations by structure: (decoder, transfer, worker kind,
        how it is read and batched); configurations without workers are a structure
        of their own per decoder and transfer."""
        found: dict[tuple[str, ...], list[LoaderConfig]] = {}
        for config in self.grid():
            kind = config.workers if config.num_workers else "none"
            key = (config.decode, config.transfer, kind, config.access, config.batching)
            found.setdefault(key, []).append(config)
        return found

    def baseline_name(self, config: LoaderConfig) -> str | None:
        for name, baseline in self.baselines().items():
            if baseline == config:
                return name
        return None


class _Replay:
    """Stands in for an Optuna trial: each suggestion is answered with ``config``'s value
    and recorded, so the space's own branches say which parameters ``config`` sets."""

    def __init__(self, config: LoaderConfig) -> None:
        self.values = asdict(config)
        self.point: dict[str, Any] = {}

    def suggest_int(self, name: str, low: int, high: int) -> Any:
        return self._answer(name)

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
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
