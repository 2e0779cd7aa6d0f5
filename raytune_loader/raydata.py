"""A Ray Data pipeline as a candidate: the worker side of a pipeline variant run by CPU
actors anywhere in the cluster, its batches consumed by the training process.

This is the one module that calls Ray Data. A :class:`RayDataConfig` is one candidate,
valid by construction: the actors (a fixed count or a min-max pool), the CPUs each
reserves, the rows of one map call, ``prefetch_batches``, what crosses the object
store (``float32`` or ``uint8`` images, or the ``encoded`` files for a device-side
decode), the object store budget, the block size and ``locality_with_output``.
:func:`build_dataset` reads a source as a Ray Dataset (:func:`rows_of`: an image
folder's files, webdataset or Parquet shards through Ray's own readers, or any map-style
dataset by index) whose ``map_batches`` actors make each row into the worker side a
DataLoader worker runs for the same variant
(:func:`raytune_loader.transforms.worker_image`, or the source's own decoder);
:class:`RayDataLoader` iterates it (or one ``streaming_split`` part per rank) as the
DataLoader path yields batches, each wrapped as a
:class:`~raytune_loader.batches.Stamped` from the actors' own times when measured.
:func:`placement_bundles` is the reservation: the placement-group bundles a trial holds
for its actors beside its own. :func:`ray_docs_default` is the pipeline as Ray's
documentation writes it, the Ray Data baseline.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytune_loader.errors import ConfigError, CorruptSampleError, DatasetError
from raytune_loader.space import LoaderConfig

if TYPE_CHECKING:
    import numpy as np
    import ray.data
    from ray.util.placement_group import PlacementGroup
    from torch.utils.data import Dataset as TorchDataset

    from raytune_loader.job import SegmentSpec
    from raytune_loader.sources.base import RayRead

log = logging.getLogger(__name__)

CROSSES = ("float32", "uint8", "encoded")  # what an actor puts in the object store per image
CPU_DECODERS = ("pil", "tensor")  # where an actor decodes: PIL, or to tensors (decoders.py)
PIN_SHARE = 0.001  # a sliver of a custom resource pins a bundle to the nodes that carry it
TASKS_PER_ACTOR = 2  # Ray Data's map tasks in flight per actor (max_concurrency 1 x factor 2)
# Ray's read tasks of shards take no CPU of their own: they hand the files' bytes to the
# actors, which decode (the trial reserves CPUs for its actors alone, and a read task
# that waited for one would wait for ever beside a full pool)
READ_CPUS = 0.0


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
        return asdict(self)

    def with_batch_size(self, batch_size: int) -> RayDataConfig:
        return replace(self, batch_size=batch_size)

    @property
    def fixed(self) -> bool:
        return self.min_actors == self.max_actors

    @property
    def actor_cpus(self) -> float:
        """CPUs the actors reserve at most (the pool at its largest)."""
        return self.max_actors * self.cpus_per_actor

    @property
    def transfer(self) -> str:
        """The pipeline variant's ``transfer`` (as :class:`~raytune_loader.space.LoaderConfig`)."""
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


def config_of(candidate: LoaderConfig) -> RayDataConfig:
    """A Ray Data candidate of the search (``engine="raydata"``) as the pipeline it runs."""
    if candidate.engine != "raydata":
        raise ConfigError(f"{candidate.label()} is a DataLoader, not a Ray Data candidate")
    return RayDataConfig.from_dict(candidate.raydata_values())


def ray_docs_default(batch_size: int, max_actors: int) -> RayDataConfig:
    """The pipeline as Ray's documentation writes it, the Ray Data baseline: a callable
    class in ``map_batches`` with Ray's defaults (an autoscaling pool from one actor,
    unbounded: here up to ``max_actors``, what the trial may take; one CPU per actor; no
    ``batch_size``, so whole blocks), ``iter_torch_batches``' ``prefetch_batches=1``,
    the ``DataContext``'s defaults (128 MiB blocks, half the object store), and the
    torchvision transforms of Ray's image examples in the map (float32 crosses)."""
    return RayDataConfig(batch_size=batch_size, min_actors=1, max_actors=max_actors)


# The reservation ------------------------------------------------------------------------


def actor_bundles(config: RayDataConfig, pin: str | None = None) -> list[dict[str, float]]:
    """One placement-group bundle per actor of the pool at its largest, each the CPUs one
    actor takes (and a sliver of ``pin``, a custom resource of the CPU nodes, to keep
    them there): any actor fits any of them, and the strategy may put them on
    different nodes."""
    bundle: dict[str, float] = {"CPU": float(config.cpus_per_actor)}
    if pin:
        bundle[pin] = PIN_SHARE
    return [dict(bundle) for _ in range(config.max_actors)]


def placement_bundles(
    head: Mapping[str, float],
    config: RayDataConfig,
    *,
    pin: str | None = None,
    remote_cpus: float | None = None,
) -> list[dict[str, float]]:
    """A trial's bundles with a Ray Data candidate: ``head`` first (Tune runs the
    trainable in the first bundle: the training process's CPUs, GPU and node type),
    then :func:`actor_bundles`. ``remote_cpus`` (``--remote-cpus``) caps what the actors
    may take; a candidate above it is refused."""
    if remote_cpus is not None and config.actor_cpus > remote_cpus + 1e-9:
        raise ConfigError(
            f"{config.label()}: its actors take {config.actor_cpus:g} CPUs, more than "
            f"--remote-cpus {remote_cpus:g}"
        )
    return [dict(head), *actor_bundles(config, pin)]


def reserved_cpus(bundles: Sequence[Mapping[str, float]]) -> tuple[float, float]:
    """(CPUs of the head bundle, CPUs of the others): the trial's own and its actors'."""
    return float(bundles[0].get("CPU", 0.0)), float(sum(b.get("CPU", 0.0) for b in bundles[1:]))


def remote_cpus(
    nodes: Sequence[Mapping[str, float]], trial_resource: str | None, pin: str | None = None
) -> float:
    """CPUs of the nodes beyond the trials' (those without ``trial_resource``; with
    ``pin``, only those carrying it), from ``ray.nodes()``' resources: what Ray Data
    candidates may take. None without a resource that tells the trials' nodes apart:
    on one machine nothing is remote."""
    return float(sum(n.get("CPU", 0.0) for n in nodes if is_remote(n, trial_resource, pin)))


def is_remote(
    resources: Mapping[str, float], trial_resource: str | None, pin: str | None = None
) -> bool:
    """Whether a node (its ``ray.nodes()`` resources) is beyond the trials': without
    ``trial_resource`` (and with ``pin``, when given); none is without the resource."""
    if not trial_resource:
        return False
    return resources.get(trial_resource, 0) <= 0 and (not pin or resources.get(pin, 0) > 0)


# What the measurement holds ----------------------------------------------------------------


def in_flight_batches(config: RayDataConfig) -> int:
    """Training batches the pipeline can hold ahead of the loop besides the one it trains
    on: ``prefetch_batches`` (and the one being formatted) in the training process, and
    each actor's map calls in flight (:data:`TASKS_PER_ACTOR`, a training batch at least
    each). Blocks waiting in the object store are bounded by bytes, not batches: the
    actors' stamps keep them out of the rate (:mod:`raytune_loader.steady`, rule 2)."""
    rows = config.map_batch_size or config.batch_size
    in_actors = config.max_actors * TASKS_PER_ACTOR * math.ceil(rows / config.batch_size)
    return config.prefetch_batches + 1 + in_actors


def producers(config: RayDataConfig) -> int:
    """How many makers of batches run at once: the actors (each stamp is its actor's
    wall time, so actors sharing a core each count, their times stretched)."""
    return config.max_actors


def warmup_batches(config: RayDataConfig, spec: SegmentSpec) -> int:
    """Batches trained before the window: the warm-up steps and the drain."""
    return spec.warmup_steps + in_flight_batches(config)


def bytes_in_flight(config: RayDataConfig, sample_bytes: int) -> tuple[int, int]:
    """(host bytes, object store bytes) the trial's node holds: the prefetched batches
    and the one being formatted in the training process; in its object store (in
    ``/dev/shm``), the execution's budget where one is set, else the blocks of those
    batches and of each actor's map calls in flight (Ray Data holds them there, zero-copy,
    until the loop has taken them)."""
    batch = sample_bytes * config.batch_size
    host = batch * (config.prefetch_batches + 1)
    store = config.object_store_bytes or batch * in_flight_batches(config)
    return host, store


# The source as rows -----------------------------------------------------------------------


def image_rows(dataset: TorchDataset[Any]) -> list[tuple[str, int]]:
    """The (file, class) rows of an image-folder dataset (``ImageFolder``, or a ``Subset``
    of one: the trial's samples): what the actors read."""
    from torch.utils.data import Subset

    indices: Sequence[int] | None = None
    while isinstance(dataset, Subset):
        inner = list(dataset.indices)
        indices = inner if indices is None else [inner[i] for i in indices]
        dataset = dataset.dataset
    samples = getattr(dataset, "samples", None)
    if not samples:
        raise DatasetError(
            f"{type(dataset).__name__} is not an image folder: a Ray Data candidate reads "
            "the synthetic-imagenet, imagenet and imagefolder sources"
        )
    chosen = range(len(samples)) if indices is None else indices
    return [(str(samples[i][0]), int(samples[i][1])) for i in chosen]


@dataclass(frozen=True)
class ByIndex:
    """A map-style dataset read by index: the rows are its indices, and each actor holds
    the dataset (pickled once, into the actor) and calls ``dataset[i]``, as a DataLoader
    worker does, so its samples are the worker side of the variant it was built with."""

    dataset: TorchDataset[Any]


def rows_of(dataset: TorchDataset[Any]) -> Sequence[tuple[str, int]] | ByIndex | RayRead:
    """What the actors read of a measurement's dataset: an image folder's (file, class)
    rows (:func:`image_rows`, the trial's subset); a stream's shards through Ray's own
    reader (:meth:`~raytune_loader.sources.base.ShardStream.ray_read`: webdataset tar
    shards, Parquet files); a table's Parquet files (``--dataset hf``, the whole table:
    ``read_parquet`` reads files, not rows by index); otherwise the map-style dataset by
    index (:class:`ByIndex`). A stream of the user's cannot be read: a DatasetError."""
    from torch.utils.data import IterableDataset, Subset

    from raytune_loader.sources.base import ShardStream

    base = dataset
    while isinstance(base, Subset):
        base = base.dataset
    if getattr(base, "samples", None):
        return image_rows(dataset)
    if isinstance(base, ShardStream):
        read = base.ray_read()
        if read is None:
            raise DatasetError(
                "Ray Data has no reader of these shards (save_to_disk's Arrow files as a "
                "stream): read them map-style, or pass --no-ray-data"
            )
        return read
    ray_read = getattr(base, "ray_read", None)
    read = ray_read() if callable(ray_read) else None
    if read is not None:
        return read
    if isinstance(base, IterableDataset) or not hasattr(base, "__len__"):
        raise DatasetError(
            f"{type(base).__name__} is a stream: Ray Data's actors read a map-style dataset "
            "by index (a Hugging Face streaming dataset from the Hub is one such stream); "
            "return a map-style dataset (save it locally, or read its Parquet files with "
            "--dataset hf), or pass --no-ray-data"
        )
    return ByIndex(dataset)


def epoch_order(count: int, samples: int | None, seed: int) -> list[int]:
    """Indices of ``count`` rows for one epoch of ``samples`` (default: each row once):
    seeded permutations, one after another, cut to length (a segment reads its subset
    reshuffled as often as it needs, as the DataLoader path's sampler does)."""
    import torch

    wanted = count if samples is None else samples
    order: list[int] = []
    draw = 0
    while len(order) < wanted:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + draw)
        order += torch.randperm(count, generator=generator).tolist()
        draw += 1
    return order[:wanted]


# The actors' side -------------------------------------------------------------------------

RowDecoder = Callable[[dict[str, Any]], tuple[Any, int]]  # a row's columns -> (sample, class)


def make_samples(
    batch: Mapping[str, Any], transfer: str, decode: str, decoded: RowDecoder | None = None
) -> dict[str, Any]:
    """A map call's rows made into samples as a DataLoader worker makes them: each row
    (a dict of its columns) through ``decoded``, the source's decoder of the variant
    (default: rows ``path``, ``label`` of image files, each file read and passed through
    :func:`~raytune_loader.transforms.worker_image`), with when each row's making started
    and ended (the stacking counted in the last row's). Images cross as one
    (N, 3, 224, 224) array; encoded files as bytes."""
    import numpy as np

    decoded = decoded or FileImage(transfer, decode)
    made_list: list[Any] = []
    labels: list[int] = []
    started, made = [], []
    for index in range(len(next(iter(batch.values())))):
        started.append(time.monotonic())
        sample, label = decoded(_row(batch, index))
        made_list.append(sample.numpy().tobytes() if decode == "device" else _array(sample))
        labels.append(int(label))
        made.append(time.monotonic())
    images: np.ndarray = (
        np.array(made_list, dtype=object) if decode == "device" else np.stack(made_list)
    )
    made[-1] = time.monotonic()
    rows = len(made)
    return {"image": images, "label": np.asarray(labels, dtype=np.int64),
            "_started": np.array(started), "_made": np.array(made),
            "_rss": np.full(rows, _resident()), "_free": np.full(rows, _available())}  # fmt: skip


def _row(batch: Mapping[str, Any], index: int) -> dict[str, Any]:
    """One row of a numpy batch as the sources' decoders read a sample: Python scalars,
    without the cells a reader left empty (a webdataset sample without that member)."""
    import numpy as np

    row: dict[str, Any] = {}
    for name, values in batch.items():
        value = values[index]
        if isinstance(value, np.generic):
            value = value.item()
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        row[name] = value
    return row


def _array(sample: Any) -> Any:
    import numpy as np

    return sample.numpy() if hasattr(sample, "numpy") else np.asarray(sample)


@dataclass(frozen=True)
class FileImage:
    """An image-folder row (``path``, ``label``) as the variant's sample: the file read
    and passed through :func:`~raytune_loader.transforms.worker_image`."""

    transfer: str
    decode: str

    def __call__(self, row: dict[str, Any]) -> tuple[Any, int]:
        from raytune_loader.transforms import worker_image

        path = str(row["path"])
        try:
            return worker_image(Path(path).read_bytes(), self.transfer, self.decode), row["label"]
        except CorruptSampleError as exc:
            raise CorruptSampleError(f"corrupt sample {path}: {exc}") from None


@dataclass(frozen=True)
class Indexed:
    """A :class:`ByIndex` row (``index``) as the dataset's own sample."""

    dataset: TorchDataset[Any]

    def __call__(self, row: dict[str, Any]) -> tuple[Any, int]:
        sample, label = self.dataset[int(row["index"])][:2]
        return sample, label


def _resident() -> int:
    """This process's resident bytes (an actor's, as it hands a map call over)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def _available() -> int:
    """This node's available memory."""
    import psutil

    return int(psutil.virtual_memory().available)


class SampleMaker:
    """The callable class the actors run (one per actor, so a stateful pool): the
    variant's :func:`make_samples`, with torch's threads held to the actor's CPUs (one,
    as in a DataLoader worker, for one CPU)."""

    def __init__(
        self, transfer: str, decode: str, threads: int, decoded: RowDecoder | None = None
    ) -> None:
        import torch

        torch.set_num_threads(threads)
        self.transfer, self.decode, self.decoded = transfer, decode, decoded

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        return make_samples(batch, self.transfer, self.decode, self.decoded)


# The training process's side ---------------------------------------------------------------


def batch_collate(decode: str, stamp: bool = False, watch: PipelineWatch | None = None) -> Any:
    """``iter_torch_batches``' ``collate_fn`` for a variant: a numpy batch of made
    samples as the DataLoader path's batch, ``[images, labels]`` (images a tensor, or an
    :class:`~raytune_loader.pipeline.EncodedBatch` of the files), zero-copy from the
    object store. With ``stamp``, a :class:`~raytune_loader.batches.Stamped` whose
    ``made - started`` is the actors' own time for its rows (on their hosts' clocks:
    only the difference means anything); ``watch`` reads what the actors said of their
    memory."""
    return _collate_class()(decode, stamp, watch)


@functools.cache
def _collate_class() -> type:
    """The collate class, made on first use: a ``NumpyBatchCollateFn`` (Ray 2.47
    deprecated plain functions), without importing Ray Data with this module."""
    from ray.data.collate_fn import NumpyBatchCollateFn

    class BatchCollate(NumpyBatchCollateFn):  # type: ignore[misc]
        def __init__(self, decode: str, stamp: bool, watch: PipelineWatch | None) -> None:
            self.decode = decode
            self.stamp = stamp
            self.watch = watch

        def __call__(self, batch: dict[str, np.ndarray]) -> Any:
            if self.watch is not None:
                self.watch.saw(batch)
            return _collated(batch, self.decode, self.stamp)

    return BatchCollate


def _collated(batch: dict[str, np.ndarray], decode: str, stamp: bool) -> Any:
    import torch
    from ray.data.util.torch_utils import convert_ndarray_to_torch_tensor

    labels = convert_ndarray_to_torch_tensor(batch["label"])
    if decode == "device":
        from raytune_loader.pipeline import collate_encoded

        files = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in batch["image"]]
        out = collate_encoded(list(zip(files, labels.tolist(), strict=True)))
    else:
        out = [convert_ndarray_to_torch_tensor(batch["image"]), labels]
    if not stamp:
        return out
    from raytune_loader.batches import Stamped

    cost = float((batch["_made"] - batch["_started"]).sum())
    made = float(batch["_made"].max())
    return Stamped(out, made - cost, made)


def iteration_arguments(
    config: RayDataConfig,
    *,
    stamp: bool = False,
    device: str = "cpu",
    watch: PipelineWatch | None = None,
) -> dict[str, Any]:
    """``iter_torch_batches``' keyword arguments for ``config``: for a plain loop, a
    ``get_dataset_shard(...)`` in Ray Train, and the trial alike. ``device="cpu"``
    leaves the batch on the host, as a DataLoader does; the variant's device side
    (:func:`raytune_loader.pipeline.to_device`) then moves and finishes it."""
    return {
        "batch_size": config.batch_size,
        "prefetch_batches": config.prefetch_batches,
        "collate_fn": batch_collate(config.decode, stamp, watch),
        "drop_last": True,
        "device": device,
    }


class RayDataLoader:
    """The batches of a Ray Dataset (or one ``streaming_split`` part) as a training loop
    reads them: each ``iter()`` an epoch, one execution of the pipeline whose actors end
    with it, however it ends (a generator: closing it shuts the execution down, as an
    abandoned DataLoader epoch's workers end)."""

    def __init__(self, source: ray.data.Dataset | ray.data.DataIterator, config: RayDataConfig,
                 *, stamp: bool = False) -> None:  # fmt: skip
        self.source = source
        self.config = config
        self.stamp = stamp
        self.batch_size = config.batch_size
        self.watch = PipelineWatch() if stamp else None  # a measured loader's

    def __iter__(self) -> Iterator[Any]:
        arguments = iteration_arguments(self.config, stamp=self.stamp, watch=self.watch)
        batches = iter(self.source.iter_torch_batches(**arguments))
        corrupt: str | None = None
        failed = False
        try:
            yield from batches
            if self.watch is not None:  # the epoch's execution is over: its figures
                self.watch.executed(self.source)
        except CorruptSampleError as exc:
            # Ray's wrapper is one too; its cause's first line is the actor's, naming the
            # file (Ray Data appends its advice on retries below it)
            said = str(getattr(exc, "cause", exc)).strip().splitlines()
            corrupt = said[0] if said else "corrupt sample"
        except BaseException:
            failed = True
            raise
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # Ray Data's own finally shuts the executor and its actors down
            if failed or corrupt is not None:
                # Ray Data leaves a failed execution in reference cycles that hold its
                # actors' handles: its actors end at the next collection, so now
                gc.collect()
        if corrupt is not None:
            # raised here, not from the wrapper: its frames hold the execution, whose
            # actors would live as long as the error does
            raise CorruptSampleError(corrupt)


class PipelineWatch:
    """What a measured Ray Data segment shows beyond its rate: the bytes Ray spilled from
    the object store during the window (the cluster's count, before and after), the
    largest resident memory an actor reported and the least memory its node had free,
    and Ray Data's own figures of its last full execution (the largest USS it measured
    in the actors' map tasks; the time its executor held the actors' tasks back,
    backpressure)."""

    def __init__(self) -> None:
        self.actor_rss = 0
        self.actor_free: int | None = None
        self._spilled: list[int | None] = []
        self.stats: dict[str, Any] = {}

    def saw(self, batch: Mapping[str, Any]) -> None:
        """A batch's rows as the actors made them: what they said of their memory."""
        if "_rss" in batch and len(batch["_rss"]):
            self.actor_rss = max(self.actor_rss, int(batch["_rss"].max()))
            free = int(batch["_free"].min())
            self.actor_free = free if self.actor_free is None else min(self.actor_free, free)

    def window_started(self) -> None:
        self._spilled = [spilled_bytes()]

    def window_ended(self) -> None:
        self._spilled.append(spilled_bytes())

    def executed(self, source: Any) -> None:
        """An execution read to its end: Ray Data's figures of its map operator."""
        summary = getattr(source, "get_stats_summary", None)
        extra = dict(getattr(summary(), "extra_metrics", None) or {}) if summary else {}
        uss = (extra.get("max_uss_bytes") or {}).get("max")
        held = [extra.get(k) for k in ("task_submission_backpressure_time",
                                       "task_output_backpressure_time_s")]  # fmt: skip
        self.stats = {
            "actor_uss_ray_bytes": None if uss is None else int(uss),
            "backpressure_s": sum(float(h) for h in held if h) if extra else None,
        }

    def figures(self) -> dict[str, Any]:
        """The segment's figures by :class:`~raytune_loader.outcomes.SegmentMetrics`'
        names."""
        start, end = (self._spilled + [None, None])[:2]
        return {
            "store_spilled_bytes": None if start is None or end is None else end - start,
            "actor_rss_bytes": self.actor_rss or None,
            "actor_free_bytes": self.actor_free,
            "actor_uss_ray_bytes": self.stats.get("actor_uss_ray_bytes"),
            "backpressure_s": self.stats.get("backpressure_s"),
        }


def spilled_bytes() -> int | None:
    """Bytes Ray has spilled from the cluster's object stores since it started (the
    reading Ray Data's own statistics take, from the GCS); None where it does not say."""
    import grpc
    import ray

    if not ray.is_initialized():
        return None
    try:
        from ray._private.internal_api import get_memory_info_reply, get_state_from_address

        address = ray.get_runtime_context().gcs_address
        return int(get_memory_info_reply(get_state_from_address(address)).store_stats
                   .spilled_bytes_total)  # fmt: skip
    except (ImportError, AttributeError, ConnectionError, RuntimeError, grpc.RpcError) as exc:
        log.debug("no spill reading: %s", exc)
        return None


def split_loaders(
    dataset: ray.data.Dataset,
    config: RayDataConfig,
    parts: int,
    *,
    stamp: bool = False,
    locality_hints: list[str] | None = None,
) -> list[RayDataLoader]:
    """One loader per rank: ``streaming_split(parts, equal=True)`` (each rank as many
    rows, so no rank of a synchronous step waits at an epoch's end for one that has
    none); the parts are disjoint and cover the dataset when its length divides."""
    splits = dataset.streaming_split(parts, equal=True, locality_hints=locality_hints)
    return [RayDataLoader(split, config, stamp=stamp) for split in splits]


# The dataset --------------------------------------------------------------------------------


def locality_with_output_works() -> bool:
    """Whether the installed Ray honours ``ExecutionOptions.locality_with_output`` (Ray
    2.60 kept the attribute as a no-op that warns and reads back False)."""
    from ray.data import ExecutionOptions

    options = ExecutionOptions()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options.locality_with_output = True  # type: ignore[assignment]
    return bool(options.locality_with_output)


def data_context(config: RayDataConfig) -> ray.data.DataContext:
    """A copy of the current ``DataContext`` with the candidate's settings: a dataset
    built under it keeps them (Ray seals the context into each dataset), whatever else
    the process builds."""
    import ray
    from ray.data import DataContext, ExecutionResources

    context = DataContext.get_current().copy()
    context.enable_progress_bars = False  # the search prints its own progress
    context.print_on_execution_start = False
    # a file that does not decode reaches the loop as the CorruptSampleError the actor
    # raised (a trial's corrupt_sample), not as Ray Data's UserCodeException around it
    context.raise_original_map_exception = True
    if config.block_bytes is not None:
        context.target_max_block_size = config.block_bytes
    if config.object_store_bytes is not None:
        context.execution_options.resource_limits = ExecutionResources(
            object_store_memory=config.object_store_bytes
        )
    if config.locality_with_output:
        if not locality_with_output_works():
            raise ConfigError(
                f"locality_with_output is a no-op in Ray {ray.__version__} (removed from "
                "ExecutionOptions): leave it off"
            )
        context.execution_options.locality_with_output = True  # type: ignore[assignment]
    return context


def build_dataset(
    rows: Sequence[tuple[str, int]] | ByIndex | RayRead,
    config: RayDataConfig,
    *,
    seed: int = 0,
    samples: int | None = None,
    placement_group: PlacementGroup | None = None,
) -> ray.data.Dataset:
    """The Ray Dataset of ``rows`` (:func:`rows_of`) for ``config``: an epoch of
    ``samples`` rows (default each once), in a new order every epoch, made into samples
    by :class:`SampleMaker` actors. The actors (and the read tasks of shards) take the
    bundles of ``placement_group`` (default: the one this process runs in, a Tune
    trial's, whose head bundle it fills: so the actors land in the others), or, outside
    any, Ray's own scheduling."""
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    pool = (
        ActorPoolStrategy(size=config.max_actors)
        if config.fixed
        else ActorPoolStrategy(min_size=config.min_actors, max_size=config.max_actors)
    )
    group = placement_group or ray.util.get_current_placement_group()
    placement = _placement(group)
    log.debug(
        "%s: %s; actors in %s", config.label(), type(rows).__name__,
        f"placement group {group.id.hex()}" if group else "Ray's own scheduling",
    )  # fmt: skip
    with DataContext.current(data_context(config)), warnings.catch_warnings():
        # Ray 2.60 deprecates the remote args that carry a placement group (removed in
        # 2.64) and offers none in their place; tests/test_raydata.py checks the actors
        # still land in the bundles
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        dataset, decoded = _read(rows, config, seed, samples, placement)
        return dataset.map_batches(
            SampleMaker,
            fn_constructor_kwargs={"transfer": config.transfer, "decode": config.decode,
                                   "threads": max(1, int(config.cpus_per_actor)),
                                   "decoded": decoded},
            batch_size=config.map_batch_size,
            compute=pool,
            num_cpus=config.cpus_per_actor,
            udf_modifying_row_count=False,
            **placement,
        )  # fmt: skip


def _read(
    rows: Sequence[tuple[str, int]] | ByIndex | RayRead,
    config: RayDataConfig,
    seed: int,
    samples: int | None,
    placement: dict[str, Any],
) -> tuple[ray.data.Dataset, RowDecoder | None]:
    """The rows as a Ray Dataset, and the decoder the actors pass each through (None: an
    image folder's files). Rows listed here (files, indices) take one epoch's seeded
    order (:func:`epoch_order`), their blocks a new order every epoch; shards are read
    by Ray's reader, in a new seeded file order every epoch."""
    import ray
    from ray.data import RandomSeedConfig

    if isinstance(rows, ByIndex):
        count, decoded = len(rows.dataset), Indexed(rows.dataset)  # type: ignore[arg-type]
    elif isinstance(rows, (list, tuple)):
        count, decoded = len(rows), None
    else:
        return _read_shards(rows, seed, samples, placement), rows.decoded
    if count == 0:
        raise DatasetError("no samples to read: the Ray Data candidate has an empty dataset")
    order = epoch_order(count, samples, seed)
    if decoded is None:
        items = [{"path": rows[i][0], "label": rows[i][1]} for i in order]  # type: ignore[index]
    else:
        items = [{"index": i} for i in order]
    blocks = math.ceil(len(items) / config.map_batch_size) if config.map_batch_size else None
    dataset = ray.data.from_items(items, override_num_blocks=blocks)
    seeded = RandomSeedConfig(seed=seed, reseed_after_execution=True)
    return dataset.randomize_block_order(seed=seeded), decoded


def _read_shards(
    read: RayRead, seed: int, samples: int | None, placement: dict[str, Any]
) -> ray.data.Dataset:
    """A stream's shards through Ray's own reader (:attr:`RayRead.reader`), the members
    or columns left undecoded for the source's decoder in the actors, rows in file
    order. An epoch reads each file once, in a seeded order drawn anew every epoch
    (``FileShuffleConfig``: shuffling blocks would hold every file's bytes before the
    first decode); ``samples`` reads the files pass after pass (:func:`shard_passes`),
    cut to length."""
    import ray
    from ray.data import FileShuffleConfig

    if read.rows < 1:
        raise DatasetError("no samples to read: the Ray Data candidate's shards are empty")
    common: dict[str, Any] = {"num_cpus": READ_CPUS, "ray_remote_args": placement or None}
    if samples is None:
        paths = list(read.paths)
        common["shuffle"] = FileShuffleConfig(seed=seed, reseed_after_execution=True)
    else:
        paths = shard_passes(read.paths, math.ceil(samples / read.rows), seed)
    if read.reader == "webdataset":
        dataset = ray.data.read_webdataset(paths, decoder=None, **common)
    elif read.reader == "parquet":
        columns = list(read.columns) or None
        dataset = ray.data.read_parquet(paths, columns=columns, include_paths=True, **common)
    else:
        raise DatasetError(f"Ray Data has no reader {read.reader!r}: use webdataset or parquet")
    return dataset if samples is None else dataset.limit(samples)


def shard_passes(paths: Sequence[str], passes: int, seed: int) -> list[str]:
    """``paths`` listed ``passes`` times, each pass in its own seeded order (as
    :func:`epoch_order` lists rows): a segment longer than the shards reads every file
    once before any twice, but where Ray's read tasks finish out of order, at the edges
    of a pass."""
    return [paths[i] for i in epoch_order(len(paths), passes * len(paths), seed)]


def _placement(group: PlacementGroup | None) -> dict[str, Any]:
    """The remote arguments that put the actors in ``group``'s bundles (any with room)."""
    if group is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(group, placement_group_capture_child_tasks=True)
    return {"scheduling_strategy": strategy}


@contextlib.contextmanager
def segment_loader(
    dataset: TorchDataset[Any], config: RayDataConfig, spec: SegmentSpec, seed: int
) -> Iterator[RayDataLoader]:
    """The candidate over ``dataset`` (the trial's subset) as a segment reads it, like
    :func:`raytune_loader.measure.segment_batches`: one epoch as long as the warm-up,
    the drain and the window, every batch stamped; the execution ends with the block."""
    import torch

    torch.set_num_threads(spec.compute_threads)
    samples = config.batch_size * (warmup_batches(config, spec) + spec.steps)
    loader = RayDataLoader(
        build_dataset(rows_of(dataset), config, seed=seed, samples=samples), config, stamp=True
    )
    yield loader


# What receiving costs the training process's node, measured where it runs ----------------


class ReadySamples:
    """The callable class of :func:`receive_seconds`' actor: each map call answered with
    one batch of images made once, so that the actor costs only what putting it in the
    object store costs, and outruns the loop."""

    def __init__(self, transfer: str, rows: int) -> None:
        import numpy as np

        dtype = np.float32 if transfer == "float32" else np.uint8
        self.images = np.zeros((rows, 3, 224, 224), dtype=dtype)

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        import numpy as np

        rows = len(batch["label"])
        return {"image": self.images[:rows], "label": np.asarray(batch["label"], dtype=np.int64)}


def in_placement_group() -> bool:
    """Whether this process runs in a placement group (a trial's, or the profile's)."""
    import ray

    return ray.is_initialized() and ray.util.get_current_placement_group() is not None


def receive_seconds(config: RayDataConfig, batches: int = 12, warm: int = 4) -> float:
    """Seconds the training process's node spends a training batch taking ``config``'s
    batches out of the object store (the transfer from the actor's node, formatting,
    collating, the executor's own threads): a pipeline of one actor that answers each map
    call with ready images, in this process's placement group, read as a trial reads it;
    the wall time per batch of ``batches`` after ``warm`` (on a node whose cores the
    loop has to itself, its cost there)."""
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    rows = config.batch_size
    items = [{"label": i % 10} for i in range((warm + batches) * rows)]
    placement = _placement(ray.util.get_current_placement_group())
    with DataContext.current(data_context(config)), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        dataset = ray.data.from_items(items, override_num_blocks=warm + batches).map_batches(
            ReadySamples, fn_constructor_kwargs={"transfer": config.transfer, "rows": rows},
            batch_size=rows, compute=ActorPoolStrategy(size=1), num_cpus=config.cpus_per_actor,
            udf_modifying_row_count=False, **placement,
        )  # fmt: skip
    batches_read = iter(RayDataLoader(dataset, config))
    try:
        for _ in range(warm):
            next(batches_read)
        started = time.perf_counter()
        for _ in range(batches):
            next(batches_read)
        return (time.perf_counter() - started) / batches
    finally:
        batches_read.close()  # type: ignore[attr-defined]
