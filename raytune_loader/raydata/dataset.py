"""The Ray Dataset of a pipeline: a source's rows, read and made into samples by actors.

:func:`build_dataset` reads the rows (:mod:`raytune_loader.raydata.rows`: files listed
here, or shards through Ray's own readers) in a new seeded order every epoch, and maps
them with :class:`~raytune_loader.raydata.actors.SampleMaker` actors in the bundles of
the placement group it runs in (a trial's); :func:`data_context` carries the
candidate's settings into it.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from raytune_loader.candidates.rules import ACTOR_FETCHES
from raytune_loader.errors import ConfigError, DatasetError
from raytune_loader.raydata.actors import Indexed, RowDecoder, SampleMaker
from raytune_loader.raydata.config import RayDataConfig
from raytune_loader.raydata.rows import ByIndex, epoch_order, shard_passes

if TYPE_CHECKING:
    import ray.data
    from ray.util.placement_group import PlacementGroup

    from raytune_loader.loaders.shard_stream import RayRead
log = logging.getLogger(__name__)


# Ray's read tasks of shards take no CPU of their own: they hand the files' bytes to the
# actors, which decode (the trial reserves CPUs for its actors alone, and a read task
# that waited for one would wait for ever beside a full pool)
READ_CPUS = 0.0


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
    placement = placement_options(group)
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
        count = len(rows.dataset)  # type: ignore[arg-type]
        decoded = Indexed(rows.dataset, ACTOR_FETCHES)
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
    """A stream's shards through Ray's own reader (:attr:`RayRead.reader`; a bucket's
    through Arrow's S3 filesystem, :func:`~raytune_loader.stores.arrow.arrow_filesystem`),
    the members or columns left undecoded for the source's decoder in the actors, rows
    in file order. An epoch reads each file once, in a seeded order drawn anew every epoch
    (``FileShuffleConfig``: shuffling blocks would hold every file's bytes before the
    first decode); ``samples`` reads the files pass after pass (:func:`shard_passes`),
    cut to length."""
    import ray
    from ray.data import FileShuffleConfig

    if read.rows < 1:
        raise DatasetError("no samples to read: the Ray Data candidate's shards are empty")
    common: dict[str, Any] = {"num_cpus": READ_CPUS, "ray_remote_args": placement or None}
    if read.store is not None:  # a bucket's objects, through Arrow's S3 client
        from raytune_loader.stores.arrow import arrow_filesystem

        common["filesystem"] = arrow_filesystem(read.store)
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


def placement_options(group: PlacementGroup | None) -> dict[str, Any]:
    """The remote arguments that put the actors in ``group``'s bundles (any with room)."""
    if group is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(group, placement_group_capture_child_tasks=True)
    return {"scheduling_strategy": strategy}
