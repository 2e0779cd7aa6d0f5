"""The bounds of the search space, from the options, the machine and the cluster.

:func:`search_space` is the space a search runs: the workers a rank may have
(:func:`worker_bound`), the batch sizes, what the source lets the search choose (the
pipeline, decoders, thread workers, how it is read and batched), and the CPUs a Ray
Data candidate's actors may take (:func:`raydata_cpus`); :func:`actors_bounded` holds
those to what the cost model says can raise the rate.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from raytune_loader.candidates.rules import FETCH_THREADS, READ_AHEAD
from raytune_loader.errors import ConfigError
from raytune_loader.machine import hardware
from raytune_loader.measuring.job import TrialJob
from raytune_loader.progress import Progress
from raytune_loader.stores.cache import default_budget, default_folder
from raytune_loader.tuning.costmodel import CostModel
from raytune_loader.tuning.options import SearchOptions
from raytune_loader.tuning.space import SearchSpace

log = logging.getLogger(__name__)


def search_space(
    opts: SearchOptions,
    usable: int,
    cuda: bool,
    progress: Progress,
    job: TrialJob | None = None,
    raydata_cpus: float = 0.0,
) -> SearchSpace:
    """The search space; ``usable`` is the CPUs of the largest node a trial may run on,
    shared by the trial's ranks: each rank's workers are bounded by usable // ranks
    (:func:`worker_bound`), and by what the prepared ``job``'s stream can keep busy. Its
    source says what else is searched (the pipeline, decoders, thread workers, how it
    is read and batched); ``raydata_cpus`` what a Ray Data candidate's actors may take
    (:func:`raydata_cpus`)."""
    ranks = max(1, opts.ranks_per_node)
    max_workers = worker_bound(opts, usable)
    batch_sizes = tuple(opts.for_device(cuda).batch_sizes or ())
    if job is None:
        trainer = opts.trainer
        return SearchSpace(max_workers, batch_sizes, cuda, usable, ranks=ranks, trainer=trainer)
    spec, source = job.dataset, job.dataset.source
    accesses = source.accesses(spec)
    if job.stream_workers == 0:  # too few shards to stream: read by index only
        accesses = tuple(a for a in accesses if a != "stream")
    if job.stream_note:  # said once, here, where the bound takes effect
        progress.warn(job.stream_note)
    pipeline = source.pipeline_searched(spec)
    return SearchSpace(
        max_workers=max_workers,
        batch_sizes=batch_sizes,
        cuda=cuda,
        usable_cpus=usable,
        pipeline=pipeline,
        decodes=source.decoders(spec, cuda) if pipeline else ("pil",),
        thread_workers=source.thread_workers(spec),
        ranks=ranks,
        accesses=accesses,
        batchings=source.batchings(spec),
        stream_workers=job.stream_workers,
        raydata_cpus=raydata_cpus,
        locality_works=raydata_cpus >= 1 and _locality_works(),
        fetch_threads=_fetch_threads(source.fetches(spec), accesses),
        caches=_caches(job, accesses, progress),
        trainer=opts.trainer,
    )  # fmt: skip


def _fetch_threads(fetches: bool, accesses: tuple[str, ...]) -> tuple[int, ...]:
    """Requests in flight per worker: a batch's objects by index, or a stream's shards
    ahead (each held whole in memory, so fewer); one where nothing is fetched."""
    if not fetches:
        return (1,)
    return FETCH_THREADS if "map" in accesses else READ_AHEAD


def _caches(job: TrialJob, accesses: tuple[str, ...], progress: Progress) -> tuple[bool, ...]:
    """A local cache of a bucket's objects is a candidate where the source's samples are
    objects read by index and a whole epoch of them (the listing's bytes) fits the
    cache's budget: one that cannot hold an epoch would only evict what the next needs."""
    epoch = getattr(job.listing, "bytes", 0)
    if "map" not in accesses or not epoch or not job.dataset.source.fetches(job.dataset):
        return (False,)
    budget = job.cache_bytes if job.cache_bytes is not None else default_budget(default_folder())
    if epoch > budget:
        progress.warn(f"a local object cache is not a candidate: an epoch reads {epoch / 1e9:.2f} "
                      f"GB, the cache may hold {budget / 1e9:.2f} GB (--cache-bytes)")  # fmt: skip
        return (False,)
    return (False, True)


def _arrow_refuses(job: TrialJob) -> str | None:
    """Why Ray's own readers (Arrow's S3 client) cannot read the job's shards in a
    bucket as its storage options say (:func:`raytune_loader.stores.arrow.refused`); None
    where they can, or where the actors read through the package's own client (a
    source read by index)."""
    from raytune_loader.stores.arrow import refused
    from raytune_loader.stores.store import Store, StoreOptions
    from raytune_loader.stores.url import is_remote, parse

    spec = job.dataset
    if not spec.data_root or not is_remote(spec.data_root):
        return None
    if "map" in spec.source.accesses(spec):
        return None
    problem = refused(Store(parse(spec.data_root), StoreOptions.from_pairs(spec.storage_options)))
    return None if problem is None else str(problem)


def _locality_works() -> bool:
    from raytune_loader import raydata

    return raydata.locality_with_output_works()


def raydata_cpus(opts: SearchOptions, cluster: Any, job: TrialJob, progress: Progress) -> float:
    """The CPUs one trial's Ray Data actors may take: those of the nodes beyond the
    trials' (``--node-type``; ``--cpu-node-type``'s), or with ``--ray-data`` on one
    node those beyond the trial's own, at most ``--remote-cpus``; 0 where Ray Data is not
    offered (``--no-ray-data``, a source its actors cannot read, several ranks)."""
    if opts.ray_data is False or (opts.ray_data is None and not cluster.remote_cpus):
        return 0.0
    if opts.trainer is not None:
        if opts.ray_data:
            progress.warn(f"Ray Data candidates are not offered with --trainer {opts.trainer}: "
                          "the trainer builds a DataLoader")  # fmt: skip
        return 0.0
    if job.ranks > 1 or not job.dataset.source.ray_data_reads(job.dataset):
        why = "several ranks per trial" if job.ranks > 1 else job.dataset.name
        if opts.ray_data:
            progress.warn(f"Ray Data candidates are not offered with {why}: its actors read "
                          "image folders, webdataset shards and hf tables (local or on a "
                          "bucket), and map-style datasets of your own, for one rank per "
                          "trial")  # fmt: skip
        return 0.0
    problem = _arrow_refuses(job)
    if problem is not None:  # said once here, not by every Ray Data trial
        if opts.ray_data:
            progress.warn(f"Ray Data candidates are not offered: {problem}")
        return 0.0
    cpus = cluster.remote_cpus or max(0.0, cluster.node_cpus - job.cpus_for(0))
    if opts.remote_cpus is not None:
        cpus = min(cpus, opts.remote_cpus)
    if cpus < 1:
        progress.warn(f"Ray Data candidates need a CPU for an actor; {cpus:g} are free for them")
        return 0.0
    where = "beyond the trials' nodes" if cluster.remote_cpus else "beside the trial (one node)"
    progress.stage(f"Ray Data candidates: actors on up to {cpus:g} CPUs {where}")
    return cpus


def worker_bound(opts: SearchOptions, usable: int, progress: Progress | None = None) -> int:
    """The most workers a rank may have: ``--max-workers``, at most its share of the
    ``usable`` CPUs (said on ``progress`` when the flag asks for more)."""
    ranks = max(1, opts.ranks_per_node)
    per_rank = usable // ranks
    asked = per_rank if opts.max_workers is None else opts.max_workers
    if asked > per_rank and progress is not None:
        share = f" usable CPUs / {ranks} ranks" if ranks > 1 else " usable CPUs"
        progress.warn(f"--max-workers {asked} is more than the {per_rank}{share}; using {per_rank}")
    return min(asked, per_rank)


def trial_gpus(opts: SearchOptions, cuda: bool) -> float:
    """A trial's GPUs, all its ranks together: by default half a GPU for one rank (two
    trials share it), a GPU per rank with several (or the node's GPUs, shared)."""
    if opts.gpus_per_trial is None:
        if not cuda:
            return 0.0
        ranks = opts.ranks_per_node
        return 0.5 if ranks == 1 else float(min(ranks, hardware.gpu_info()["gpu_count"]))
    present = hardware.gpu_info()["gpu_count"]
    if opts.gpus_per_trial > present and not opts.address:
        raise ConfigError(
            f"--gpus-per-trial {opts.gpus_per_trial} but this machine has {present} GPUs; "
            "use a smaller value (0 on a CPU-only machine)"
        )
    return opts.gpus_per_trial


def actors_bounded(space: SearchSpace, model: CostModel | None, progress: Progress) -> SearchSpace:
    """The space with Ray Data's actors held to the CPUs the cost model says reach the
    training process's own pace (:meth:`CostModel.remote_cpus`): more cannot raise it."""
    if model is None or not space.raydata:
        return space
    needed = model.remote_cpus(space)
    if needed is None or needed >= space.raydata_cpus:
        return space
    progress.stage(
        f"Ray Data: the cost model puts the training process's pace at {needed:g} actors' "
        f"CPUs (with a margin); the space offers up to those, not {space.raydata_cpus:g}"
    )
    return replace(space, raydata_cpus=max(1.0, needed))


def objective_options(
    opts: SearchOptions, space: SearchSpace, job: TrialJob, progress: Progress
) -> SearchOptions:
    """GPU utilization counts the pipeline's device-side stages as busy: where the
    space puts some there, on CUDA, the search maximizes samples/s instead."""
    if opts.objective != "util" or not space.pipeline or job.device != "cuda":
        return opts
    progress.stage(
        "Objective samples/s: some candidates finish their input pipeline on the GPU, "
        "which GPU utilization would count as training"
    )
    return replace(opts, objective="samples_per_s")
