"""The search space: candidate input pipelines and what each one costs.

A :class:`LoaderConfig` is one candidate: a DataLoader (``engine="dataloader"``), or a
Ray Data pipeline whose actors make the batches on the cluster's CPUs
(``engine="raydata"``, :mod:`raytune_loader.raydata` runs it); the fields of the other
engine are inert (:data:`RULES`). :class:`SearchSpace` turns the user's bounds into an
Optuna define-by-run function that only proposes combinations PyTorch and Ray accept
(``prefetch_factor`` and ``persistent_workers`` only with workers, ``pin_memory`` only
with CUDA, actors only where the cluster has CPUs for them), and into the baselines
every search measures first. :func:`reserved_cpus` is the one formula for a trial's Ray
reservation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
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
ENGINES = ("dataloader", "raydata")  # who makes the batches: a DataLoader, or Ray Data's actors
RAY_DOCS = "ray-docs-default"  # the Ray Data baseline: the pipeline as Ray's docs write it
ACTOR_CPUS = (1.0, 2.0)  # CPUs per actor the space offers (the remote CPUs allowing)
PREFETCH_BATCHES = (1, 2, 4, 8)  # iter_torch_batches(prefetch_batches=)
MIN_ACTORS = (None, 1)  # a fixed pool of max_actors, or Ray's autoscaling pool from one actor
OBJECT_STORE_BUDGETS = (None, 2**30)  # the execution's object store budget: Ray's share, 1 GiB
BLOCK_SIZES = (None, 2**23)  # target_max_block_size: Ray's 128 MiB, or 8 MiB


def _knob(default: Any, label: str, role: str = "loader", shown_as: str | None = None) -> Any:
    """A field of :class:`LoaderConfig`: a DataLoader argument (``role="loader"``), a
    stage of the pipeline around it (``"pipeline"``), a setting each worker process
    applies when it starts (``"worker"``: the tuned loader's ``worker_init_fn`` sets it,
    in every dataset's search, where the pipeline section is only written for the
    datasets whose pipeline is searched), the engine that makes the batches
    (``"engine"``), or a knob of a Ray Data pipeline (``"raydata"``: the fields of
    :class:`raytune_loader.raydata.RayDataConfig` of the same name, ``max_actors`` its
    pool at its largest, ``min_actors`` ``None`` for a fixed pool); ``label`` heads its
    column in tables;
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
    thread (:func:`raytune_loader.loader.build_dataloader` applies it in the workers).
    With ``engine="raydata"`` the batches are made by Ray Data actors running the same
    worker side (``transfer`` and ``decode`` say which; ``decode="device"``: the encoded
    files cross the object store), the DataLoader's arguments are inert and the Ray
    Data knobs apply; ``None`` in one of them is Ray's default."""

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
    engine: str = _knob("dataloader", "engine", role="engine")
    max_actors: int | None = _knob(None, "actors", role="raydata")
    min_actors: int | None = _knob(None, "min actors", role="raydata")
    cpus_per_actor: float | None = _knob(None, "CPUs per actor", role="raydata")
    map_batch_size: int | None = _knob(None, "map batch", role="raydata")
    prefetch_batches: int | None = _knob(None, "prefetch batches", role="raydata")
    object_store_bytes: int | None = _knob(None, "object store budget", role="raydata")
    block_bytes: int | None = _knob(None, "block bytes", role="raydata")
    locality_with_output: bool = _knob(False, "locality with output", role="raydata")

    def __post_init__(self) -> None:
        values = asdict(self)
        for name, check in _VALUE_CHECKS.items():
            problem = check(values[name])
            if problem:
                raise ConfigError(f"{name} must be {problem}, got {values[name]!r}")
        for rule in RULES:
            if not rule.when(values) and values[rule.name] != rule.inert:
                raise ConfigError(rule.says)
        if self.min_actors is not None and self.min_actors >= self.pool_size:
            raise ConfigError(
                f"min_actors ({self.min_actors}) must be below max_actors ({self.pool_size}) "
                "for an autoscaling pool; leave it null for a fixed pool"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any], batch_size: int | None = None) -> LoaderConfig:
        """Build from a Tune trial config or a JSON ``loader`` section (with the
        ``pipeline`` and ``worker_init`` sections' keys merged in): a field that does not
        apply takes its inert value (:data:`RULES`), one that applies but is missing its
        default; then the constructor validates."""
        known = set(CONFIG_KEYS)
        unknown = set(values) - known
        if unknown:
            raise ConfigError(
                f"unknown loader keys {sorted(unknown)}; expected some of {sorted(known)}"
            )
        merged = {**_DEFAULTS, "batch_size": batch_size, **values}
        if merged["batch_size"] is None:
            raise ConfigError("loader config has no batch_size")
        engine, workers = merged["engine"], merged["num_workers"]
        if engine not in ENGINES:
            raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if engine == "dataloader" and (not isinstance(workers, int) or workers < 0):
            raise ConfigError(f"num_workers must be an integer >= 0, got {workers!r}")
        for rule in RULES:
            if not rule.when(merged):
                merged[rule.name] = rule.inert
            elif merged[rule.name] is None and rule.default is not None:
                merged[rule.name] = rule.default
        if merged["min_actors"] is not None and merged["min_actors"] == merged["max_actors"]:
            merged["min_actors"] = None  # a pool from n to n actors is a fixed pool of n
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

    def raydata_values(self) -> dict[str, Any]:
        """A Ray Data candidate's knobs by :class:`~raytune_loader.raydata.RayDataConfig`'s
        names (its ``from_dict`` takes them): the pool, what crosses the object store and
        where the actors decode, Ray's defaults where a knob is ``None``."""
        values = {k: getattr(self, k) for k in RAYDATA_KEYS}
        values.update(
            batch_size=self.batch_size,
            max_actors=self.pool_size,
            min_actors=self.min_actors or self.pool_size,
            cpus_per_actor=self.actor_cpus_each,
            prefetch_batches=1 if self.prefetch_batches is None else self.prefetch_batches,
            crosses="encoded" if self.decode == "device" else self.transfer,
            decoder="pil" if self.decode == "device" else self.decode,
        )
        return values

    @classmethod
    def from_raydata(cls, values: Mapping[str, Any]) -> LoaderConfig:
        """The candidate a Ray Data section (:meth:`raydata_values`'s keys) describes."""
        known = {*RAYDATA_KEYS, "batch_size", "crosses", "decoder"}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(
                f"unknown Ray Data keys {sorted(unknown)}; expected some of {sorted(known)}"
            )
        knobs = {k: v for k, v in values.items() if k in RAYDATA_KEYS}
        crosses, decoder = values.get("crosses", "float32"), values.get("decoder", "pil")
        if crosses == "encoded" and decoder != "pil":
            raise ConfigError("crosses=encoded decodes on the device: leave decoder at pil")
        stages = (
            {"decode": "device", "transfer": "uint8"}
            if crosses == "encoded"
            else {"decode": decoder, "transfer": crosses}
        )
        if "batch_size" not in values:
            raise ConfigError("the Ray Data section has no batch_size")
        return cls.from_dict({**knobs, **stages, "engine": "raydata"}, values["batch_size"])

    @property
    def pool_size(self) -> int:
        """Ray Data actors at most (the pool at its largest); 0 for a DataLoader."""
        if self.engine != "raydata":
            return 0
        return 1 if self.max_actors is None else self.max_actors

    @property
    def actor_cpus_each(self) -> float:
        return 1.0 if self.cpus_per_actor is None else float(self.cpus_per_actor)

    @property
    def actor_cpus(self) -> float:
        """CPUs a Ray Data candidate's actors reserve (beyond the trial's own); 0 for a
        DataLoader."""
        return self.pool_size * self.actor_cpus_each

    def with_batch_size(self, batch_size: int) -> LoaderConfig:
        return LoaderConfig(**{**asdict(self), "batch_size": batch_size})

    def label(self) -> str:
        """Short human-readable form for tables and progress lines: the fields that
        apply (:data:`RULES`), the pipeline's choices as words."""
        if self.engine == "raydata":
            return self._raydata_label()
        values = asdict(self)
        shown = [f"workers={self.num_workers}"]
        if applies("prefetch_factor", values):
            shown.append(f"prefetch={self.prefetch_factor}")
        shown.append(f"pin={_yn(self.pin_memory)}")
        if applies("persistent_workers", values):
            shown.append(f"persistent={_yn(self.persistent_workers)}")
        shown.append(f"bs={self.batch_size}")
        if self.transfer == "uint8" and applies("transfer", values):
            shown.append("uint8")
        shown += [{"pil": "", "tensor": "tensor-decode", "device": "device-decode"}[self.decode]]
        shown += ["stream" if self.access == "stream" else ""]
        shown += ["batched-in-workers" if self.batching == "workers" else ""]
        shown += ["threads" if self.workers == "thread" else ""]  # each inert where it
        shown += ["" if self.in_order else "unordered"]  # does not apply: nothing shown
        shown += [self.multiprocessing_context or ""]
        shown += [f"worker-threads={self.worker_threads}" if self.worker_threads else ""]
        return " ".join(word for word in shown if word)

    def _raydata_label(self) -> str:
        low = self.min_actors
        actors = f"{low}-{self.pool_size}" if low else str(self.pool_size)
        shown = [f"raydata actors={actors}x{self.actor_cpus_each:g}cpu", f"bs={self.batch_size}"]
        shown.append(f"map={self.map_batch_size or 'block'}")
        shown.append(f"prefetch={1 if self.prefetch_batches is None else self.prefetch_batches}")
        crosses = "encoded" if self.decode == "device" else self.transfer
        shown.append(crosses if crosses != "float32" else "")
        shown.append("tensor-decode" if self.decode == "tensor" else "")
        if self.object_store_bytes:
            shown.append(f"store={self.object_store_bytes / 2**20:.0f}MiB")
        if self.block_bytes:
            shown.append(f"block={self.block_bytes / 2**20:g}MiB")
        shown.append("local-output" if self.locality_with_output else "")
        return " ".join(s for s in shown if s)


CONFIG_KEYS = tuple(f.name for f in fields(LoaderConfig))
LOADER_KEYS = tuple(f.name for f in fields(LoaderConfig) if f.metadata["role"] == "loader")
PIPELINE_KEYS = tuple(f.name for f in fields(LoaderConfig) if f.metadata["role"] == "pipeline")
WORKER_KEYS = tuple(f.name for f in fields(LoaderConfig) if f.metadata["role"] == "worker")
RAYDATA_KEYS = tuple(f.name for f in fields(LoaderConfig) if f.metadata["role"] == "raydata")
LABELS = {f.name: f.metadata["label"] for f in fields(LoaderConfig)}
SHOWN_IN_PIPELINE = {f.name: f.metadata["shown_as"] for f in fields(LoaderConfig)
                     if f.metadata["shown_as"]}  # fmt: skip


def _yn(flag: bool) -> str:
    return "y" if flag else "n"


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
    kind = config.workers if applies("workers", asdict(config)) else "none"
    if config.engine == "raydata":
        kind = "raydata"
    return Structure(config.decode, config.transfer, kind, config.access, config.batching)


@dataclass(frozen=True)
class Rule:
    """When a field of :class:`LoaderConfig` means something: ``when`` the other values
    allow it; otherwise it holds ``inert``, and a candidate that sets it otherwise is
    refused with ``says``. ``default`` fills it in where it applies and is not given."""

    name: str
    when: Callable[[Mapping[str, Any]], bool]
    inert: Any
    says: str
    default: Any = None


def _workers(values: Mapping[str, Any]) -> bool:
    return values["num_workers"] > 0


def _processes(values: Mapping[str, Any]) -> bool:
    return values["num_workers"] > 0 and values["workers"] == "process"


def _dataloader(values: Mapping[str, Any]) -> bool:
    return values["engine"] == "dataloader"


def _raydata(values: Mapping[str, Any]) -> bool:
    return values["engine"] == "raydata"


def _autoscaling(values: Mapping[str, Any]) -> bool:
    return values["engine"] == "raydata" and (values["max_actors"] or 1) > 1


def _raydata_rule(name: str, inert: Any = None, default: Any = None) -> Rule:
    return Rule(name, _raydata, inert, f"{name} is a Ray Data knob: it needs engine raydata",
                default)  # fmt: skip


# PyTorch's rules for a candidate and the pipeline's, each written once: the constructor
# refuses what breaks one, from_dict normalises by them, the space's define-by-run
# suggests a field only where its rule applies, and label() shows only those fields.
# In order: a rule reads only the fields of the rules before it.
RULES = (
    Rule(
        "num_workers",
        _dataloader,
        0,
        "a Ray Data candidate's batches are made by its actors: num_workers 0 (max_actors "
        "sets the actors)",
    ),  # fmt: skip
    Rule(
        "pin_memory",
        _dataloader,
        False,
        "pin_memory is a DataLoader argument: engine raydata leaves it false",
    ),  # fmt: skip
    Rule(
        "access",
        _dataloader,
        "map",
        "a Ray Data candidate reads the image files as rows: access map",
    ),  # fmt: skip
    Rule("workers", _workers, "process", "thread workers need num_workers > 0"),
    Rule("prefetch_factor", _workers, None, "prefetch_factor needs num_workers > 0", default=2),
    Rule(
        "persistent_workers",
        _processes,
        False,
        "persistent_workers needs num_workers > 0 and process workers (thread workers cost "
        "nothing to keep)",
    ),  # fmt: skip
    Rule("in_order", _workers, True, "in_order needs num_workers > 0"),
    Rule(
        "multiprocessing_context",
        _processes,
        None,
        "multiprocessing_context needs num_workers > 0 and process workers (thread workers "
        "start no process)",
    ),  # fmt: skip
    Rule(
        "worker_threads",
        _processes,
        None,
        "worker_threads limits the thread pools of worker processes: it needs num_workers > 0 "
        "and process workers (thread workers share the training process's pools, and "
        "limiting them would limit the training step too)",
    ),  # fmt: skip
    Rule(
        "transfer",
        lambda v: v["decode"] != "device",
        "uint8",
        "decode=device finishes the images on the device: transfer uint8",
    ),  # fmt: skip
    Rule(
        "batching",
        lambda v: v["access"] == "stream",
        "loader",
        "batching in the workers is a choice of streams (access stream)",
    ),  # fmt: skip
    _raydata_rule("max_actors", default=1),
    Rule(
        "min_actors",
        _autoscaling,
        None,
        "min_actors makes an autoscaling pool: it needs engine raydata and max_actors > 1 "
        "(null: a fixed pool of max_actors)",
    ),  # fmt: skip
    _raydata_rule("cpus_per_actor", default=1.0),
    _raydata_rule("map_batch_size"),
    _raydata_rule("prefetch_batches", default=1),
    _raydata_rule("object_store_bytes"),
    _raydata_rule("block_bytes"),
    _raydata_rule("locality_with_output", inert=False),
)
_RULES = {rule.name: rule for rule in RULES}
_COUNTED = ("num_workers", "max_actors")  # suggested as integers in a range
_DEFAULTS = {f.name: f.default for f in fields(LoaderConfig) if f.name != "batch_size"}


def applies(name: str, values: Mapping[str, Any]) -> bool:
    """Whether field ``name`` means something, given the other ``values`` (:data:`RULES`)."""
    rule = _RULES.get(name)
    return rule is None or rule.when(values)


def _one_of(choices: tuple[Any, ...], words: str | None = None) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else words or f"one of {', '.join(map(str, choices))}"

    return check


def _integer(low: int, words: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
        return None if ok else words

    return check


def _optional(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    return lambda value: None if value is None else check(value)


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _positive(value: Any) -> str | None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return None if number and 0 < value < float("inf") else "a number > 0 or null"


# Each field's own values (its rule in RULES says when it applies).
_VALUE_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "batch_size": _integer(1, "a positive integer"),
    "num_workers": _integer(0, "an integer >= 0"),
    "prefetch_factor": _optional(_integer(1, "a positive integer")),
    "pin_memory": _flag,
    "persistent_workers": _flag,
    "in_order": _flag,
    "multiprocessing_context": _one_of(
        (*START_METHODS, "fork"), "fork, forkserver or spawn (or null: the platform's)"
    ),
    "transfer": _one_of(TRANSFERS),
    "decode": _one_of(DECODES),
    "workers": _one_of(WORKER_KINDS),
    "access": _one_of(ACCESSES),
    "batching": _one_of(BATCHINGS),
    "worker_threads": _optional(_integer(1, "a positive integer or null")),
    "engine": _one_of(ENGINES),
    "max_actors": _optional(_integer(1, "a positive integer or null")),
    "min_actors": _optional(_integer(1, "a positive integer or null")),
    "cpus_per_actor": _optional(_positive),
    "map_batch_size": _optional(_integer(1, "a positive integer or null (whole blocks)")),
    "prefetch_batches": _optional(_integer(0, "an integer >= 0 or null")),
    "object_store_bytes": _optional(_integer(1, "a positive integer or null (Ray's share)")),
    "block_bytes": _optional(_integer(1, "a positive integer or null (Ray's 128 MiB)")),
    "locality_with_output": _flag,
}


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
    raydata_cpus: float = 0.0  # CPUs a Ray Data candidate's actors may take (0: none offered)
    locality_works: bool = False  # Ray honours locality_with_output (2.60 does not)

    def __post_init__(self) -> None:
        if "device" in self.decodes and not self.cuda:
            raise ConfigError("decoding on the device needs CUDA")
        if self.max_workers < 0:
            raise ConfigError(f"--max-workers must be >= 0, got {self.max_workers}")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ConfigError(f"batch sizes must be positive integers, got {self.batch_sizes}")
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
        for name, choices in self._searched(values):
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
        if values["engine"] == "raydata":  # the actors read the files by index
            values["access"] = "map"
        yield "access", list(self.accesses) if len(self.accesses) > 1 else None
        most = self.max_workers  # a stream's workers share its shards: no more than them
        if values["access"] == "stream" and self.stream_workers is not None:
            most = min(most, self.stream_workers)
        yield "num_workers", list(range(0, most + 1))
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
        of every Ray Data knob (:func:`raytune_loader.raydata.ray_docs_default` is the
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
