"""What receiving a pipeline's batches costs the training process's node.

:func:`receive_seconds` reads batches from one actor that answers every map call with
ready images, in the profile's placement group, as a trial would: the transfer from
the actor's node, formatting and collating, the executor's own threads, per batch.
The cost model adds it to a Ray Data candidate's training process.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from raytune_loader.raydata.config import RayDataConfig
from raytune_loader.raydata.dataset import data_context, placement_options
from raytune_loader.raydata.receiving import RayDataLoader

if TYPE_CHECKING:
    pass
log = logging.getLogger(__name__)


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
    placement = placement_options(ray.util.get_current_placement_group())
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
