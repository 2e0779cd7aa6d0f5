"""The search as a Python API: options in, ``best_config.json`` and friends out.

:func:`run_search` is what ``python -m raytune_loader.search`` runs: prepare the
data (generate the default dataset, pre-warm the subset), start or join Ray,
measure the ceiling, run the Tune search, re-measure the top configurations and
both baselines one at a time (with the ceiling again beside them), choose the
cheapest within noise of the best and write ``results/<dataset>/``. Progress goes
to a :class:`~raytune_loader.progress.Progress` object, so the command line can
show it and the API can log it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from raytune_loader import findings, hardware, probes, records, streams
from raytune_loader.bestconfig import SearchContext, best_config
from raytune_loader.costmodel import CostModel
from raytune_loader.errors import (
    ConfigError,
    ModelError,
    RaytuneLoaderError,
    SearchInterruptedError,
    last_line,
)
from raytune_loader.factories import import_factory
from raytune_loader.job import TrialJob, dataset_spec, job_from_options
from raytune_loader.models import default_model, validate_model
from raytune_loader.options import SearchOptions, is_loopback
from raytune_loader.prepare import prepare_data
from raytune_loader.progress import LogProgress, Progress
from raytune_loader.records import TrialRecord
from raytune_loader.results import ensure_writable, write_json
from raytune_loader.space import SearchSpace
from raytune_loader.verify import (
    Verified,
    measure_ceilings,
    verification_configs,
    verify,
    with_input_rates,
)

log = logging.getLogger(__name__)
RESUME_POINTER = "last_search.json"  # the interrupted search --resume continues


@dataclass(frozen=True)
class SearchResult:
    out_dir: Path
    best_config: dict[str, Any]
    trials: list[TrialRecord] = field(default_factory=list)
    dashboard_url: str | None = None


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
        return SearchSpace(max_workers, batch_sizes, cuda, usable, ranks=ranks)
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
    )  # fmt: skip


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
    if job.ranks > 1 or not job.dataset.source.ray_data_reads(job.dataset):
        why = "several ranks per trial" if job.ranks > 1 else job.dataset.name
        if opts.ray_data:
            progress.warn(f"Ray Data candidates are not offered with {why}: its actors read "
                          "image folders, webdataset shards, hf tables and map-style datasets "
                          "of your own, for one rank per trial")  # fmt: skip
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


def _gpus_per_trial(opts: SearchOptions, cuda: bool) -> float:
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


def _job(opts: SearchOptions, progress: Progress) -> tuple[SearchOptions, TrialJob, float, Path]:
    """Check all that can be checked before Ray starts: (the options with the device's
    defaults filled in, the job, GPUs per trial, the results folder)."""
    cuda = hardware.cuda_available()
    opts = opts.for_device(cuda and opts.gpus_per_trial != 0)
    opts.validate()
    if opts.ranks_per_node == 0:  # auto: one rank per GPU of this node
        opts = replace(opts, ranks_per_node=max(1, hardware.gpu_info()["gpu_count"]))
    gpus_per_trial = _gpus_per_trial(opts, cuda)
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
    """Run the whole search; raises a RaytuneLoaderError subclass on bad input or failure."""
    # Ray is imported only once the input is known good
    from raytune_loader import searcher, tuner

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
            job = streams.prepare_stream(  # a shard per worker they could run
                replace(job, node_cpus=node_cpus), max(opts.batch_sizes), progress
            )
        cuda = job.device == "cuda"
        remote = raydata_cpus(opts, cluster, replace(job, node_cpus=cluster.node_cpus), progress)
        if remote:
            tuner.check_cpu_nodes(cluster)
        space = search_space(opts, node_cpus, cuda, progress, job=job, raydata_cpus=remote)
        opts = _objective(opts, space, job, progress)
        job = replace(job, node_cpus=cluster.node_cpus)
        measurer = tuner.RayMeasurer(cluster, gpus_per_trial)
        job = replace(job, ceilings=measure_ceilings(job, space.batch_sizes, measurer, progress))
        max_concurrent = opts.max_concurrent or _default_concurrency(gpus_per_trial, cluster)
        name, storage, resume = _experiment(out_dir, opts, cluster, progress)
        # a resumed search goes on with the searcher Tune saved, and its model
        model = None if resume else _cost_model(opts, job, space, measurer, node_cpus, progress,
                                                remote_actors=cluster.remote_cpus > 0)  # fmt: skip
        space = _actors_bounded(space, model, progress)
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
    best, trials = _write_results(out_dir, context, by_class, verified, progress)
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


def _actors_bounded(space: SearchSpace, model: CostModel | None, progress: Progress) -> SearchSpace:
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


def _objective(
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
    from raytune_loader.tuner import RayMeasurer

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


def _write_results(
    out_dir: Path,
    context: SearchContext,
    by_class: dict[str, list[TrialRecord]],
    verified: dict[str, Verified],
    progress: Progress,
) -> tuple[dict[str, Any], list[TrialRecord]]:
    """best_config.json, trials.csv and the report; per class too when there are several."""
    rebased = {
        hw_class: [r.rebased(verified[hw_class].ceilings.get(r.effective_batch_size or 0))
                   for r in class_records]
        for hw_class, class_records in by_class.items()
    }  # fmt: skip
    results = {
        hw_class: best_config(
            context, v.candidates, rebased[hw_class], v.input_rates, v.rounds, v.probes
        )
        for hw_class, v in verified.items()
    }
    primary = next(iter(results))  # the class with the most trials
    best = dict(results[primary])
    if len(results) > 1:
        best["per_class"] = {c: f"{c}/best_config.json" for c in results}
        for hw_class, result in results.items():
            _write_folder(out_dir / hw_class, result, rebased[hw_class])
        progress.stage(f"Trials ran on {len(results)} hardware classes; results per class in "
                       f"{out_dir}/<class>/")  # fmt: skip
    trials = sorted(
        (r for class_records in rebased.values() for r in class_records),
        key=lambda r: r.finished_at or 0,
    )
    _write_folder(out_dir, best, trials)
    (out_dir / "trials.partial.csv").unlink(missing_ok=True)
    (out_dir / RESUME_POINTER).unlink(missing_ok=True)  # nothing left to resume
    return best, trials


def _write_folder(folder: Path, best: dict[str, Any], trials: list[TrialRecord]) -> None:
    from raytune_loader.report import write_report

    write_json(folder / "best_config.json", best)
    records.write_trials_csv(folder / "trials.csv", trials)
    write_report(folder)


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
    from raytune_loader.tuner import can_resume

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
