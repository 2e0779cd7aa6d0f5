"""The rules of a candidate, each written once: the values each field takes, and when
it means something.

PyTorch's rules and the pipeline's (``prefetch_factor`` and ``persistent_workers`` only
with workers, ``pin_memory`` only with CUDA, a Ray Data knob only with
``engine="raydata"``, ...) are :data:`RULES`, in order: a rule reads only the fields of
the rules before it. The constructor of
:class:`~raytune_loader.candidates.config.LoaderConfig` refuses what breaks one,
``from_dict`` normalises by them, the space suggests a field only where its rule
applies, and ``label()`` shows only those fields (:func:`applies`). The tuples of
choices (``TRANSFERS``, ``DECODES``, ``ENGINES``...) are the values the space offers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

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


FETCH_THREADS = (1, 4, 16, 64)  # a batch's objects in flight per worker, from an object store
READ_AHEAD = (1, 2, 4)  # a stream's shards fetched at once per worker (each held whole)
ACTOR_FETCHES = max(FETCH_THREADS)  # a Ray Data actor's objects in flight: a map call's, at most


ENGINES = ("dataloader", "raydata")  # who makes the batches: a DataLoader, or Ray Data's actors


ACTOR_CPUS = (1.0, 2.0)  # CPUs per actor the space offers (the remote CPUs allowing)


PREFETCH_BATCHES = (1, 2, 4, 8)  # iter_torch_batches(prefetch_batches=)


MIN_ACTORS = (None, 1)  # a fixed pool of max_actors, or Ray's autoscaling pool from one actor


OBJECT_STORE_BUDGETS = (None, 2**30)  # the execution's object store budget: Ray's share, 1 GiB


BLOCK_SIZES = (None, 2**23)  # target_max_block_size: Ray's 128 MiB, or 8 MiB


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


def engine_fixes(engine: str) -> dict[str, Any]:
    """The fields an engine fixes before the space suggests the rest: Ray Data's actors
    read a source by index (its streams through Ray's own readers, not a DataLoader's)."""
    return {"access": "map"} if engine == "raydata" else {}


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
    Rule(
        "fetch_threads",
        lambda v: v["engine"] == "dataloader",
        1,
        "fetch_threads is how many objects a DataLoader worker fetches at once (a batch's "
        "by index, or shards ahead of a stream): it needs engine dataloader",
        default=1,
    ),  # fmt: skip
    Rule(
        "cache",
        lambda v: v["engine"] == "dataloader" and v["access"] == "map",
        False,
        "cache keeps a bucket's objects on the node's disk for the next epoch: it needs "
        "engine dataloader and access map (a worker fetches them by index)",
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
    "fetch_threads": _integer(1, "a positive integer"),
    "cache": _flag,
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
