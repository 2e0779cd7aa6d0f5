"""The search's setup: from the user's options to Tune's first trial.

:func:`checked` checks everything that can be checked before Ray starts (the options
with the device's defaults, the model or step, the results folder, the dashboard's
exposure) and builds the job; :func:`plan` then, with Ray up, sizes the search to the
cluster: a stream's shards for its nodes, the CPUs Ray Data may take, the space, the
objective, the ceilings, the profile and its cost model, and Tune's experiment (a new
one, or the interrupted one ``--resume`` continues). Ray itself is imported by
:mod:`~raytune_loader.tuning.tuner`, here only inside :func:`plan`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import (
    CORRUPT_FIX,
    DatasetError,
    RaytuneLoaderError,
    corrupt_said,
    last_line,
)
from raytune_loader.files import ensure_writable, write_json
from raytune_loader.machine import hardware
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.measurer import Measurer, measure_ceilings
from raytune_loader.measuring.models import default_model
from raytune_loader.measuring.shards import prepare_stream
from raytune_loader.progress import Progress
from raytune_loader.tuning.bounds import (
    actors_bounded,
    objective_options,
    raydata_cpus,
    search_space,
    trial_gpus,
    worker_bound,
)
from raytune_loader.tuning.costmodel import CostModel
from raytune_loader.tuning.options import (
    AUTH_MODE,
    SearchOptions,
    is_loopback,
    job_from_options,
    token_auth_off,
)
from raytune_loader.tuning.space import SearchSpace

if TYPE_CHECKING:
    from raytune_loader.tuning.tuner import RayCluster, TuneSettings

log = logging.getLogger(__name__)
RESUME_POINTER = "last_search.json"  # the interrupted search --resume continues


@dataclass(frozen=True)
class Checked:
    """A search checked before Ray starts: its options with the device's defaults filled
    in, the job, the GPUs of a trial, the results folder."""

    opts: SearchOptions
    job: TrialJob
    gpus_per_trial: float
    out_dir: Path
    made: tuple[Path, ...] = ()  # the folders of out_dir made by the check, outermost first


@dataclass(frozen=True)
class Plan:
    """A search sized to its cluster: the options (the objective settled), the job (its
    ceilings measured), the space, the cost model (None: TPE alone, or a resumed search's
    own), what Tune runs, and the trials side by side."""

    opts: SearchOptions
    job: TrialJob
    space: SearchSpace
    model: CostModel | None
    settings: TuneSettings
    max_concurrent: int


def checked(opts: SearchOptions, progress: Progress) -> Checked:
    """Check all that can be checked before Ray starts, and build the job.

    Args:
        opts: the user's options.
        progress: where warnings are said.

    Returns:
        The checked search; a ``UserInputError`` naming the first impossible value.
    """
    cuda = hardware.cuda_available()
    opts = opts.for_device(cuda and opts.gpus_per_trial != 0)
    opts.validate()
    if opts.ranks_per_node == 0:  # auto: one rank per GPU of this node
        opts = replace(opts, ranks_per_node=max(1, hardware.gpu_info()["gpu_count"]))
    gpus_per_trial = trial_gpus(opts, cuda)
    if not opts.address:  # on a cluster the bounds follow its nodes, known once joined
        worker_bound(opts, hardware.usable_cpus(), progress)
    if not is_loopback(opts.dashboard_host):
        who = (f"can reach it can run code on this machine ({AUTH_MODE} turns its token off)"
               if token_auth_off(False)
               else "can reach it and has the token in ~/.ray/auth_token can run code on "
               "this machine")  # fmt: skip
        progress.warn(f"the Ray dashboard listens on {opts.dashboard_host}: anyone who {who}")
    job = job_from_options(
        opts,
        opts.model or default_model(cuda),
        device="cuda" if cuda and gpus_per_trial > 0 else "cpu",
        node_cpus=hardware.usable_cpus(),
        gpu_memory_share=min(1.0, gpus_per_trial / opts.ranks_per_node) if gpus_per_trial else 1.0,
    )
    out_dir = Path(opts.out) / job.dataset.slug
    made = ensure_writable(out_dir)
    half = job.precision if job.precision in hardware.HALF_PRECISION_FLAGS else None
    # this machine's flags; on a cluster (--address) the trials run on other nodes' CPUs
    local = not opts.address
    if local and job.device == "cpu" and half and hardware.cpu_computes_in(half) is False:
        progress.warn(
            f"--precision {half} on a CPU without {half} instructions: PyTorch emulates it, "
            f"so every trial's step runs several times slower than in fp32; leave --precision "
            f"out for fp32 unless you train in {half} here"
        )
    return Checked(opts, job, gpus_per_trial, out_dir, made)


def plan(search: Checked, cluster: RayCluster, progress: Progress) -> Plan:
    """Size the search to the cluster Ray started or joined, and say how it will run.

    Args:
        search: the checked search, its data prepared.
        cluster: the nodes the trials may run on.
        progress: where the phases are said.

    Returns:
        The plan Tune runs.
    """
    from raytune_loader.tuning import tuner

    opts, job, gpus = search.opts, search.job, search.gpus_per_trial
    announce_dashboard(cluster, progress)
    node_cpus = int(cluster.node_cpus) if cluster.joined else hardware.usable_cpus()
    batch = max(opts.batch_sizes or (1,))
    if job.stream_shards and node_cpus > job.node_cpus:  # a cluster's nodes are bigger:
        job = prepare_stream(replace(job, node_cpus=node_cpus), batch, progress)  # a shard a worker
    remote = raydata_cpus(opts, cluster, replace(job, node_cpus=cluster.node_cpus), progress)
    if remote:
        tuner.check_cpu_nodes(cluster)
    space = search_space(opts, node_cpus, job.device == "cuda", progress, job=job,
                         raydata_cpus=remote)  # fmt: skip
    opts = objective_options(opts, space, job, progress)
    job = replace(job, node_cpus=cluster.node_cpus)
    measurer = tuner.RayMeasurer(cluster, gpus)
    job = replace(job, ceilings=measure_ceilings(job, space.batch_sizes, measurer, progress))
    max_concurrent = opts.max_concurrent or default_concurrency(gpus, cluster)
    name, storage, resume = experiment(search.out_dir, opts, cluster, progress)
    # a resumed search goes on with the searcher Tune saved, and its model
    model = None if resume else cost_model(opts, job, space, measurer, node_cpus, progress,
                                           remote_actors=cluster.remote_cpus > 0)  # fmt: skip
    space = actors_bounded(space, model, progress)
    settings = tuner.TuneSettings(
        objective=opts.objective, num_samples=opts.num_samples, max_concurrent=max_concurrent,
        time_budget_s=opts.time_budget_s, gpus_per_trial=gpus, seed=opts.seed, storage=storage,
        name=name, resume=resume, verbose=opts.verbose, method=opts.search, model=model,
    )  # fmt: skip
    progress.stage(
        f"Searching {opts.num_samples} configurations of {describe_step(job)} on "
        f"{job.dataset.name}, batch {'/'.join(map(str, space.batch_sizes))} on {job.device} "
        f"({max_concurrent} at a time, objective {opts.objective})"
    )
    return Plan(opts, job, space, model, settings, max_concurrent)


def describe_step(job: TrialJob) -> str:
    """How the job trains, for the banner: ``resnet50, bf16, channels-last, compiled``."""
    if job.train_step:
        return f"--train-step {job.train_step}"
    parts = [job.model, job.precision]
    parts += ["channels-last"] if job.channels_last else []
    parts += ["compiled"] if job.compile else []
    return ", ".join(parts)


def announce_dashboard(cluster: Any, progress: Progress) -> None:
    """Say where the Ray dashboard is (its token is in ``~/.ray/auth_token``)."""
    where = "the cluster's" if cluster.joined else "Ray"
    if cluster.dashboard_url:
        token = "no token needed" if token_auth_off(True) else "token in ~/.ray/auth_token"
        progress.stage(f"{where} dashboard: {cluster.dashboard_url} ({token})")
    else:
        progress.warn("Ray dashboard not available (install ray[default] to watch trials)")


def cost_model(
    opts: SearchOptions,
    job: TrialJob,
    space: SearchSpace,
    measurer: Measurer,
    cores: int,
    progress: Progress,
    remote_actors: bool = True,
) -> CostModel | None:
    """The profile phase, for the model-guided search: each structure's stages, measured
    once in one process; None for the other methods, or when it fails (the search then
    proposes with TPE alone and says so). A corrupt sample file it read ends the search
    there, a DatasetError naming it: every trial reads the same subset, and would fail
    on it one after another before saying so."""
    if opts.search != "model":
        return None
    structures = profiled(space)
    progress.stage(f"Profiling the pipeline's stages ({len(structures)} structures)")
    try:
        found = measurer.profile(job, structures, cores)
    # the data's, torch's, or a module a structure needs that is missing (its tasks say
    # that as a RaytuneLoaderError; a measurer in this process would raise ImportError)
    except (RaytuneLoaderError, OSError, RuntimeError, ImportError) as exc:
        said = corrupt_said(last_line(exc))
        if said:  # however a task or a worker wrapped it
            raise DatasetError(f"the profile read a {said}; {CORRUPT_FIX}") from None
        progress.warn(f"the profile failed ({last_line(exc)}); searching with TPE alone")
        return None
    log.info("profile: %s", found)
    cuda = job.device.startswith("cuda")
    return CostModel(found, job.ceilings, cuda=cuda, ranks=job.ranks, remote_actors=remote_actors)


def profiled(space: SearchSpace) -> list[LoaderConfig]:
    """A configuration of each structure for the profile, beyond a trainer's limits too
    (the report says what they cost): with workers, and keeping the objects where the
    cache is offered (the profile then times a warm cache's reads too)."""
    return [
        max(configs, key=lambda c: (c.num_workers > 0, c.cache))
        for configs in space.unrestricted().structures().values()
    ]


def default_concurrency(gpus_per_trial: float, cluster: Any) -> int:
    """Trials side by side: GPU slices on a GPU or a cluster; one at a time on one CPU
    machine, whose cores they would share."""
    if gpus_per_trial:
        return max(1, int(cluster.gpus / gpus_per_trial))
    return cluster.nodes if cluster.joined else 1


def experiment(
    out_dir: Path, opts: SearchOptions, cluster: Any, progress: Progress
) -> tuple[str, str, bool]:
    """(name, storage, resume) of the Tune experiment: the last one on --resume, when
    Tune saved one; a new one otherwise (Ctrl-C may have come before Tune saved anything)."""
    from raytune_loader.tuning.tuner import can_resume

    pointer = out_dir / RESUME_POINTER
    if opts.resume:
        name = storage = ""
        why = f"no interrupted search under {out_dir} to resume"
        try:
            last = json.loads(pointer.read_text())
            name, storage = str(last["name"]), str(last["storage"])
        except OSError:
            pass  # none: no search ran there, or the last one ended
        except (ValueError, KeyError, TypeError):  # not JSON, or not this tool's record
            why = (
                f"{pointer} does not say which search to resume (not the record a search "
                f"writes); searches saved before stay under {out_dir / 'tune'}"
            )
        if name and can_resume(storage, name):
            return name, storage, True
        progress.warn(f"{why}; starting a new one")
    name = "search-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    storage = _storage(opts, out_dir, cluster, progress)
    write_json(pointer, {"name": name, "storage": storage})
    return name, storage, False


def _storage(opts: SearchOptions, out_dir: Path, cluster: Any, progress: Progress) -> str:
    """Where Tune keeps the experiment; warns when other nodes could not reach it."""
    storage = opts.storage or str((out_dir / "tune").resolve())
    if cluster.joined and cluster.nodes > 1 and "://" not in storage:
        progress.warn(
            f"Tune's storage {storage} is a local path on a {cluster.nodes}-node cluster: trials "
            "on other nodes write there on their own disks, so their files and --resume need a "
            "path every node shares (NFS) or a bucket; pass --storage s3://... or a shared path"
        )
    return storage
