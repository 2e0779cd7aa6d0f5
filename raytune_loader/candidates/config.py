"""One candidate: :class:`LoaderConfig`, plain data valid by construction.

A candidate is a DataLoader's keyword arguments, the stages of the pipeline around the
loader (where images are decoded, what crosses to the device, worker processes or
threads, read by index or as a stream), what each worker sets when it starts, its
``engine`` (who makes the batches: :mod:`raytune_loader.engines` answers for it) and the
knobs of a Ray Data pipeline. Each field is declared once with :func:`_knob` (its
label and role), and every list of keys below is derived from the fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from raytune_loader.candidates.rules import _VALUE_CHECKS, ACTOR_FETCHES, ENGINES, RULES, applies
from raytune_loader.errors import ConfigError


def _knob(default: Any, label: str, role: str = "loader", shown_as: str | None = None) -> Any:
    """A field of :class:`LoaderConfig`: a DataLoader argument (``role="loader"``), a
    stage of the pipeline around it (``"pipeline"``), a setting each worker process
    applies when it starts (``"worker"``: the tuned loader's ``worker_init_fn`` sets it,
    in every dataset's search, where the pipeline section is only written for the
    datasets whose pipeline is searched), the engine that makes the batches
    (``"engine"``), or a knob of a Ray Data pipeline (``"raydata"``: the fields of
    :class:`raytune_loader.raydata.config.RayDataConfig` of the same name, ``max_actors`` its
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
    thread (:func:`raytune_loader.loaders.loader.build_dataloader` applies it in the workers).
    With ``engine="raydata"`` the batches are made by Ray Data actors running the same
    worker side (``transfer`` and ``decode`` say which; ``decode="device"``: the encoded
    files cross the object store), the DataLoader's arguments are inert and the Ray
    Data knobs apply; ``None`` in one of them is Ray's default. ``fetch_threads`` is how
    many of a batch's objects a worker fetches at once from an object store (requests in
    flight per worker: what sets the rate against a store's latency); 1 reads them one
    after another, as a local folder's files are. ``cache`` keeps the objects a worker
    fetched in a folder on the node's disk, so that the epochs after the first read
    them there (:class:`~raytune_loader.stores.cache.ObjectCache`)."""

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
    fetch_threads: int = _knob(1, "fetch threads", role="pipeline")
    cache: bool = _knob(False, "object cache", role="pipeline")
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
        values = self.values()
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
        default; then the constructor validates.

        Args:
            values: the candidate's fields by name.
            batch_size: the batch size where ``values`` has none.

        Returns:
            The candidate; a ConfigError naming an unknown key or an impossible value.
        """
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
        """From a Tune trial config or a trials.csv row, ignoring the other keys.

        Args:
            config: a trial's parameters, or a row.

        Returns:
            The candidate they describe.
        """
        return cls.from_dict({k: v for k, v in config.items() if k in CONFIG_KEYS})

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.utils.data.DataLoader``.

        Returns:
            ``batch_size``, ``num_workers``, ``prefetch_factor``, ``pin_memory``,
            ``persistent_workers``, ``in_order`` and ``multiprocessing_context``.
        """
        return {k: getattr(self, k) for k in LOADER_KEYS}

    def pipeline(self) -> dict[str, Any]:
        """How the pipeline around the DataLoader is built (``best_config.json``'s
        ``pipeline`` section): the pipeline stages, and the DataLoader arguments that
        shape it (``in_order``, the start method: ``default`` for the platform's).

        Returns:
            The section's keys and values.
        """
        out = {k: getattr(self, k) for k in PIPELINE_KEYS}
        for name, shown_as in SHOWN_IN_PIPELINE.items():
            value = getattr(self, name)
            out[shown_as] = "default" if name == "multiprocessing_context" and not value else value
        return out

    def worker_init(self) -> dict[str, Any]:
        """What each worker process sets when it starts (``best_config.json``'s
        ``worker_init`` section).

        Returns:
            The section's keys and values.
        """
        return {k: getattr(self, k) for k in WORKER_KEYS}

    def values(self) -> dict[str, Any]:
        """Every field, DataLoader arguments, pipeline stages, then worker settings
        (trials.csv's columns).

        Returns:
            Every field by name, in that order.
        """
        return {k: getattr(self, k) for k in CONFIG_KEYS}

    def raydata_values(self) -> dict[str, Any]:
        """A Ray Data candidate's knobs by :class:`~raytune_loader.raydata.config.RayDataConfig`'s
        names (its ``from_dict`` takes them): the pool, what crosses the object store and
        where the actors decode, Ray's defaults where a knob is ``None``.

        Returns:
            The pipeline's knobs by name.
        """
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
        """The candidate a Ray Data section (:meth:`raydata_values`'s keys) describes.

        Args:
            values: a Ray Data pipeline's knobs, as :meth:`raydata_values` names them.

        Returns:
            The candidate (``engine="raydata"``); a ConfigError naming an unknown key.
        """
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
        """CPUs each of a Ray Data candidate's actors reserves (one where unset)."""
        return 1.0 if self.cpus_per_actor is None else float(self.cpus_per_actor)

    @property
    def requests_in_flight(self) -> int:
        """A store's requests the candidate keeps in flight at most: each worker's
        ``fetch_threads`` (the training process's without workers), or each Ray Data
        actor's map call's objects (up to
        :data:`~raytune_loader.candidates.rules.ACTOR_FETCHES`)."""
        if self.pool_size:
            return self.pool_size * min(ACTOR_FETCHES, self.rows_per_call)
        return self.fetch_threads * max(1, self.num_workers)

    @property
    def requests_in_flight_terms(self) -> tuple[str, str]:
        """:attr:`requests_in_flight` in words (``2 workers x 16 fetch threads``), and
        the knobs that set it."""
        if self.pool_size:
            each = min(ACTOR_FETCHES, self.rows_per_call)
            return (f"{self.pool_size} actors x {each} objects a map call",
                    "map_batch_size or max_actors")  # fmt: skip
        return (f"{self.num_workers} workers x {self.fetch_threads} fetch threads",
                "fetch_threads or workers")  # fmt: skip

    @property
    def rows_per_call(self) -> int:
        """The rows a Ray Data actor makes in one map call: ``map_batch_size``, or with
        whole blocks (None) one: Ray's blocks of a trial's rows hold a row or two."""
        return self.map_batch_size or 1

    @property
    def actor_cpus(self) -> float:
        """CPUs a Ray Data candidate's actors reserve (beyond the trial's own); 0 for a
        DataLoader."""
        return self.pool_size * self.actor_cpus_each

    def with_batch_size(self, batch_size: int) -> LoaderConfig:
        """This candidate at another batch size (the out-of-memory back-off's).

        Args:
            batch_size: the new batch size.

        Returns:
            The same candidate at ``batch_size``.
        """
        return replace(self, batch_size=batch_size)

    def label(self) -> str:
        """Short human-readable form for tables and progress lines: the fields that
        apply (:data:`RULES`), the pipeline's choices as words.

        Returns:
            One line, such as ``workers=2 prefetch=2 pin=n persistent=y bs=32 uint8``.
        """
        if self.engine == "raydata":
            return self._raydata_label()
        values = self.values()
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
        shown += [f"fetch={self.fetch_threads}" if self.fetch_threads > 1 else ""]
        shown += ["cached" if self.cache else ""]
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


_DEFAULTS = {f.name: f.default for f in fields(LoaderConfig) if f.name != "batch_size"}
