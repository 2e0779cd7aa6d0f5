"""The search as a Python API: options in, ``best_config.json`` and friends out.

:func:`run_search` is what ``python -m raytune_loader.search`` runs: prepare the data
(generate the default dataset, pre-warm the subset), start or join Ray, measure the
ceiling, profile the pipeline's stages, run the Tune search, re-measure the top
candidates and the baselines one at a time (with the ceiling again beside them), choose
the cheapest within noise of the best and write ``results/<dataset>/``. Progress goes to
a :class:`~raytune_loader.progress.Progress` object, so the command line can show it and
the API can log it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from raytune_loader.candidates.space import SearchSpace
from raytune_loader.errors import (
    ModelError,
    RaytuneLoaderError,
    SearchInterruptedError,
    last_line,
)
from raytune_loader.factories import import_factory
from raytune_loader.files import ensure_writable, write_json
from raytune_loader.machine import hardware
from raytune_loader.measuring import records, shards
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.measurer import measure_ceilings
from raytune_loader.measuring.models import default_model, validate_model
from raytune_loader.measuring.prepare import prepare_data
from raytune_loader.measuring.records import TrialRecord
from raytune_loader.outputs.bestconfig import SearchContext, write_results
from raytune_loader.progress import LogProgress, Progress
from raytune_loader.tuning.bounds import (
    actors_bounded,
    objective_options,
    raydata_cpus,
    search_space,
    trial_gpus,
    worker_bound,
)
from raytune_loader.tuning.costmodel import CostModel
from raytune_loader.tuning.options import SearchOptions, dataset_spec, is_loopback, job_from_options
from raytune_loader.verdict import findings, probes
from raytune_loader.verdict.verify import Verified, verification_configs, verify, with_input_rates

log = logging.getLogger(__name__)


RESUME_POINTER = "last_search.json"  # the interrupted search --resume continues


@dataclass(frozen=True)
class SearchResult:
    """What :func:`run_search` returns: the results folder, the content of its
    ``best_config.json``, every trial's record, and the Ray dashboard's URL (None where it
    did not start)."""

    out_dir: Path
    best_config: dict[str, Any]
    trials: list[TrialRecord] = field(default_factory=list)
    dashboard_url: str | None = None


def _job(opts: SearchOptions, progress: Progress) -> tuple[SearchOptions, TrialJob, float, Path]:
    """Check all that can be checked before Ray starts: (the options with the device's
    defaults filled in, the job, GPUs per trial, the results folder)."""
    cuda = hardware.cuda_available()
    opts = opts.for_device(cuda and opts.gpus_per_trial != 0)
    opts.validate()
    if opts.ranks_per_node == 0:  # auto: one rank per GPU of this node
        opts = replace(opts, ranks_per_node=max(1, hardware.gpu_info()["gpu_count"]))
    gpus_per_trial = trial_gpus(opts, cuda)
    model = opts.model or default_model(cuda)
    if opts.train_step:
        import_factory(opts.train_step, kind="train step", error=ModelError)
        model = opts.train_step
    else:
        validate_model(model)
    if not opts.address:  # on a cluster the bounds follow its nodes, known once joined
        worker_bound(opts, hardware.usable_cpus(), progress)
    out_dir = Path(opts.out) / dataset_spec(opts).slug
    ensure_writable(out_dir)
    job = job_from_options(
        opts,
        model,
        device="cuda" if cuda and gpus_per_trial > 0 else "cpu",
        node_cpus=hardware.usable_cpus(),
        gpu_memory_share=min(1.0, gpus_per_trial / opts.ranks_per_node) if gpus_per_trial else 1.0,
    )
    half = job.precision if job.precision in hardware.HALF_PRECISION_FLAGS else None
    # this machine's flags; on a cluster (--address) the trials run on other nodes' CPUs
    local = not opts.address
    if local and job.device == "cpu" and half and hardware.cpu_computes_in(half) is False:
        progress.warn(
            f"--precision {half} on a CPU without {half} instructions: PyTorch emulates it, "
            f"so every trial's step runs several times slower than in fp32; leave --precision "
            f"out for fp32 unless you train in {half} here"
        )
    return opts, job, gpus_per_trial, out_dir


def describe_step(job: TrialJob) -> str:
    """How the job trains, for the banner: ``resnet50, bf16, channels-last, compiled``."""
    if job.train_step:
        return f"--train-step {job.train_step}"
    parts = [job.model, job.precision]
    parts += ["channels-last"] if job.channels_last else []
    parts += ["compiled"] if job.compile else []
    return ", ".join(parts)


def run_search(opts: SearchOptions, progress: Progress | None = None) -> SearchResult:
    """Run the whole search; raises a RaytuneLoaderError subclass on bad input or failure.

    Args:
        opts: what to search (every option of the command line).
        progress: where progress is said (default: log lines).

    Returns:
        The :class:`SearchResult`; a ``SearchInterruptedError`` when Ctrl-C stopped it
        (the finished trials kept for ``--resume``), a ``SearchFailedError`` when every
        configuration failed.
    """
    # Ray is imported only once the input is known good
    from raytune_loader.tuning import searcher, tuner

    progress = progress or LogProgress()
    started = time.time()
    opts, job, gpus_per_trial, out_dir = _job(opts, progress)
    assert opts.batch_sizes is not None  # filled in for the device
    job = prepare_data(job, max(opts.batch_sizes), progress)
    if not is_loopback(opts.dashboard_host):
        progress.warn(
            f"the Ray dashboard listens on {opts.dashboard_host}: anyone who can reach it and "
            "has the token in ~/.ray/auth_token can run code on this machine"
        )
    cluster = tuner.start_ray(
        opts.address, opts.dashboard_host, hardware.usable_cpus(), opts.verbose, opts.node_type,
        opts.cpu_node_type,
    )  # fmt: skip
    try:
        _announce_dashboard(cluster, progress)
        node_cpus = int(cluster.node_cpus) if cluster.joined else hardware.usable_cpus()
        if job.stream_shards and node_cpus > job.node_cpus:  # a cluster's nodes are bigger:
            job = shards.prepare_stream(  # a shard per worker they could run
                replace(job, node_cpus=node_cpus), max(opts.batch_sizes), progress
            )
        cuda = job.device == "cuda"
        remote = raydata_cpus(opts, cluster, replace(job, node_cpus=cluster.node_cpus), progress)
        if remote:
            tuner.check_cpu_nodes(cluster)
        space = search_space(opts, node_cpus, cuda, progress, job=job, raydata_cpus=remote)
        opts = objective_options(opts, space, job, progress)
        job = replace(job, node_cpus=cluster.node_cpus)
        measurer = tuner.RayMeasurer(cluster, gpus_per_trial)
        job = replace(job, ceilings=measure_ceilings(job, space.batch_sizes, measurer, progress))
        max_concurrent = opts.max_concurrent or _default_concurrency(gpus_per_trial, cluster)
        name, storage, resume = _experiment(out_dir, opts, cluster, progress)
        # a resumed search goes on with the searcher Tune saved, and its model
        model = None if resume else _cost_model(opts, job, space, measurer, node_cpus, progress,
                                                remote_actors=cluster.remote_cpus > 0)  # fmt: skip
        space = actors_bounded(space, model, progress)
        settings = tuner.TuneSettings(
            objective=opts.objective, num_samples=opts.num_samples, max_concurrent=max_concurrent,
            time_budget_s=opts.time_budget_s, gpus_per_trial=gpus_per_trial, seed=opts.seed,
            storage=storage, name=name, resume=resume, verbose=opts.verbose,
            method=opts.search, model=model,
        )  # fmt: skip
        progress.stage(
            f"Searching {opts.num_samples} configurations of {describe_step(job)} on "
            f"{job.dataset.name}, batch {'/'.join(map(str, space.batch_sizes))} on {job.device} "
            f"({max_concurrent} at a time, objective {opts.objective})"
        )
        run = tuner.run_tune(job, space, settings, cluster, progress.trial)
        # the previous search's trials.csv stays beside its best_config.json until
        # this search has a result of its own
        records.write_trials_csv(out_dir / "trials.partial.csv", run.records)
        if run.interrupted:
            finished = sum(record.status != "interrupted" for record in run.records)
            raise SearchInterruptedError(
                f"search interrupted after {finished} finished trials, kept in {out_dir}; "
                "continue it with the same command and --resume"
            )
        by_class = records.by_hardware_class(run.records)
        verified = {
            hw_class: _verify(job, space, class_records, opts, cluster, gpus_per_trial, progress,
                              len(by_class))
            for hw_class, class_records in by_class.items()
        }  # fmt: skip
    finally:
        tuner.stop_ray()
    context = SearchContext(
        opts, space, job, started, gpus_per_trial, max_concurrent, cluster.joined,
        sampler=searcher.describe(opts.seed, opts.search),
        scheduler=tuner.scheduler_description(job), search=run.search, model=model,
    )  # fmt: skip
    best, trials = write_results(out_dir, context, by_class, verified, progress)
    (out_dir / RESUME_POINTER).unlink(missing_ok=True)  # nothing left to resume
    return SearchResult(out_dir, best, trials, cluster.dashboard_url)


def _cost_model(
    opts: SearchOptions,
    job: TrialJob,
    space: SearchSpace,
    measurer: Any,
    cores: int,
    progress: Progress,
    remote_actors: bool = True,
) -> CostModel | None:
    """The profile phase, for the model-guided search: each structure's stages, measured
    once in one process; None for the other methods, or when it fails (the search then
    proposes with TPE alone and says so)."""
    if opts.search != "model":
        return None
    structures = [
        next((c for c in configs if c.num_workers), configs[0])
        for configs in space.structures().values()
    ]
    progress.stage(f"Profiling the pipeline's stages ({len(structures)} structures)")
    try:
        found = measurer.profile(job, structures, cores)
    # the data's, torch's, or a module a structure needs that is missing (its tasks say
    # that as a RaytuneLoaderError; a measurer in this process would raise ImportError)
    except (RaytuneLoaderError, OSError, RuntimeError, ImportError) as exc:
        progress.warn(f"the profile failed ({last_line(exc)}); searching with TPE alone")
        return None
    log.info("profile: %s", found)
    cuda = job.device.startswith("cuda")
    return CostModel(found, job.ceilings, cuda=cuda, ranks=job.ranks, remote_actors=remote_actors)


def _announce_dashboard(cluster: Any, progress: Progress) -> None:
    where = "the cluster's" if cluster.joined else "Ray"
    if cluster.dashboard_url:
        progress.stage(f"{where} dashboard: {cluster.dashboard_url} (token in ~/.ray/auth_token)")
    else:
        progress.warn("Ray dashboard not available (install ray[default] to watch trials)")


def _verify(
    job: TrialJob,
    space: SearchSpace,
    class_records: list[TrialRecord],
    opts: SearchOptions,
    cluster: Any,
    gpus_per_trial: float,
    progress: Progress,
    classes: int,
) -> Verified:
    """Re-measure the top configurations and both baselines, interleaved, one at a time,
    with the whole accelerator. With several hardware classes each is verified on the
    node its best trial ran on; the baselines and reservations then follow that node."""
    from raytune_loader.tuning.tuner import RayMeasurer

    node_id = records.best_node(class_records, opts.objective) if classes > 1 else None
    node_cpus = job.node_cpus
    if node_id:
        node = next(r.node for r in class_records if r.node.node_id == node_id)
        node_cpus = float(node.node_cpus or job.node_cpus)
        space = replace(space, usable_cpus=int(node_cpus))
    configs = verification_configs(class_records, space, opts.verify_top, opts.objective)
    # one rank: the whole GPU; several: the GPUs of a trial, as in the search
    whole = min(1.0, cluster.max_node_gpus) if job.ranks == 1 else gpus_per_trial
    gpus = whole if gpus_per_trial else 0.0
    measurer = RayMeasurer(cluster, gpus, node_id)
    job = replace(job, node_cpus=node_cpus)
    if node_id:  # this class's own ceiling, not the one of whichever node measured first
        job = replace(job, ceilings=measure_ceilings(job, space.batch_sizes, measurer, progress))
    what = "verifying (each configuration alone, repeated)"
    progress.count(what, 0, len(configs) * opts.verify_repeats)
    verified = verify(
        job,
        configs,
        opts.verify_repeats,
        measurer,
        on_measured=lambda done, total, *_: progress.count(what, done, total),
        slot_base=opts.num_samples,
        objective=opts.objective,
    )
    if verified.rounds < opts.verify_repeats:
        progress.stage(f"Verification decided after {verified.rounds} of {opts.verify_repeats} "
                       "rounds: more runs could not change the winner")  # fmt: skip
    verified = with_input_rates(verified, job, opts.objective, measurer, progress)
    rules = findings.Rules(opts.memory_share, opts.cpus_per_worker)
    return probes.probe(verified, job, opts.objective, class_records, measurer, progress, rules)


def _default_concurrency(gpus_per_trial: float, cluster: Any) -> int:
    """Trials side by side: GPU slices on a GPU or a cluster; one at a time on one CPU machine,
    whose cores they would share."""
    if gpus_per_trial:
        return max(1, int(cluster.gpus / gpus_per_trial))
    return cluster.nodes if cluster.joined else 1


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


def _experiment(
    out_dir: Path, opts: SearchOptions, cluster: Any, progress: Progress
) -> tuple[str, str, bool]:
    """(name, storage, resume) of the Tune experiment: the last one on --resume, when
    Tune saved one; a new one otherwise (Ctrl-C may have come before Tune saved anything)."""
    from raytune_loader.tuning.tuner import can_resume

    pointer = out_dir / RESUME_POINTER
    if opts.resume:
        try:
            last = json.loads(pointer.read_text())
            name, storage = str(last["name"]), str(last["storage"])
        except (OSError, ValueError, KeyError):
            name, storage = "", ""
        if name and can_resume(storage, name):
            return name, storage, True
        progress.warn(f"no interrupted search under {out_dir} to resume; starting a new one")
    name = "search-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    storage = _storage(opts, out_dir, cluster, progress)
    write_json(pointer, {"name": name, "storage": storage})
    return name, storage, False
