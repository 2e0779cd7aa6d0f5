"""The search as a Python API: options in, ``best_config.json`` and friends out.

:func:`run_search` is what ``python -m raytune_loader.search`` runs: prepare the
data (generate the default dataset, pre-warm the subset), start or join Ray,
measure the ceiling, run the Tune search, re-measure the top configurations and
both baselines one at a time, choose the cheapest within noise of the best and
write ``results/<dataset>/``. Progress goes to a :class:`Progress` object, so
the command line can show it and the API can log it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from raytune_loader import datasets, hardware, outcome, synthetic
from raytune_loader.errors import (
    ConfigError,
    DatasetError,
    SearchFailedError,
    SearchInterruptedError,
    UserInputError,
)
from raytune_loader.measure import (
    SegmentSpec,
    TrialJob,
    last_line,
    subset_indices,
)
from raytune_loader.models import default_model, validate_model
from raytune_loader.results import ensure_writable, write_csv, write_json
from raytune_loader.selection import Candidate, rotated
from raytune_loader.space import LoaderConfig, SearchSpace, reserved_cpus

log = logging.getLogger(__name__)
OBJECTIVES = ("util", "samples_per_s")


class Progress(Protocol):
    def stage(self, text: str) -> None: ...
    def count(self, what: str, done: int, total: int) -> None: ...
    def trial(self, event: Any) -> None: ...
    def warn(self, text: str) -> None: ...


class LogProgress:
    """Progress as log lines (the API's default)."""

    def stage(self, text: str) -> None:
        log.info("%s", text)

    def count(self, what: str, done: int, total: int) -> None:
        log.info("%s: %d/%d", what, done, total)

    def trial(self, event: Any) -> None:
        log.debug("trial %s %s", event.trial_id, event.kind)

    def warn(self, text: str) -> None:
        log.warning("%s", text)


@dataclass(frozen=True)
class SearchOptions:
    """Every knob of a search; defaults are the command line's."""

    dataset: str = datasets.SYNTHETIC
    data_root: str | None = None
    download: bool = False
    synthetic_images: int = synthetic.DEFAULT_IMAGES
    model: str | None = None
    num_samples: int = 12
    time_budget_s: float | None = None
    max_concurrent: int | None = None
    gpus_per_trial: float | None = None
    cpus_per_worker: float = 1.0
    batch_sizes: tuple[int, ...] = (32,)
    min_batch_size: int = 1
    max_workers: int | None = None
    objective: str = "util"
    steps: int = 60
    warmup_steps: int = 5
    report_every: int = 20
    samples_per_trial: int = 1024
    compute_threads: int = 1
    trial_timeout_s: float = 600.0
    verify_top: int = 3
    verify_repeats: int = 3
    out: str = "results"
    address: str | None = None
    node_type: str | None = None
    storage: str | None = None
    dashboard_host: str = "127.0.0.1"
    expose_dashboard: bool = False
    resume: bool = False
    seed: int = 0
    cold: bool = False
    verbose: bool = False

    def validate(self) -> None:
        positive = {
            "--num-samples": self.num_samples, "--steps": self.steps,
            "--samples-per-trial": self.samples_per_trial, "--verify-repeats": self.verify_repeats,
            "--compute-threads": self.compute_threads, "--report-every": self.report_every,
            "--min-batch-size": self.min_batch_size, "--synthetic-images": self.synthetic_images,
        }  # fmt: skip
        for flag, value in positive.items():
            if value < 1:
                raise ConfigError(f"{flag} must be at least 1, got {value}")
        non_negative = {
            "--warmup-steps": self.warmup_steps, "--verify-top": self.verify_top,
            "--max-workers": self.max_workers or 0, "--gpus-per-trial": self.gpus_per_trial or 0,
        }  # fmt: skip
        for flag, value in non_negative.items():
            if value < 0:
                raise ConfigError(f"{flag} must be 0 or more, got {value}")
        gpus = self.gpus_per_trial or 0
        if gpus > 1 and not float(gpus).is_integer():
            raise ConfigError(f"--gpus-per-trial above 1 must be a whole number, got {gpus}")
        if self.trial_timeout_s <= 0:
            raise ConfigError(f"--trial-timeout must be positive, got {self.trial_timeout_s}")
        if self.cpus_per_worker <= 0:
            raise ConfigError(f"--cpus-per-worker must be positive, got {self.cpus_per_worker}")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ConfigError(f"--max-concurrent must be at least 1, got {self.max_concurrent}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ConfigError(f"--time-budget must be positive, got {self.time_budget_s}")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ConfigError(
                f"batch sizes must be positive integers, got {list(self.batch_sizes)}"
            )
        if self.min_batch_size > min(self.batch_sizes):
            raise ConfigError(
                f"--min-batch-size ({self.min_batch_size}) must not exceed the smallest batch "
                f"size ({min(self.batch_sizes)}); lower it or raise --batch-sizes"
            )
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"--objective must be one of {', '.join(OBJECTIVES)}")
        if not _is_loopback(self.dashboard_host) and not self.expose_dashboard:
            raise ConfigError(
                f"--dashboard-host {self.dashboard_host} would expose the Ray dashboard beyond "
                "this machine; add --expose-dashboard to confirm, or keep 127.0.0.1"
            )
        if self.samples_per_trial < max(self.batch_sizes):
            raise ConfigError(
                f"--samples-per-trial ({self.samples_per_trial}) must hold at least one batch "
                f"of the largest batch size ({max(self.batch_sizes)})"
            )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class SearchResult:
    out_dir: Path
    best_config: dict[str, Any]
    trials: list[dict[str, Any]] = field(default_factory=list)
    dashboard_url: str | None = None


def _prepare_data(opts: SearchOptions, progress: Progress) -> tuple[datasets.DatasetSpec, int]:
    """Generate the default dataset if needed, check the data, pre-warm the subset."""
    spec = datasets.DatasetSpec(opts.dataset, opts.data_root, opts.download, opts.synthetic_images)
    if spec.name == datasets.SYNTHETIC:
        root = spec.resolved_root()
        assert root is not None
        progress.stage(f"Synthetic ImageNet: {opts.synthetic_images} JPEG files in {root}")
        synthetic.ensure_synthetic_imagenet(
            root,
            opts.synthetic_images,
            processes=hardware.usable_cpus(),
            progress=lambda done, total: progress.count("generating JPEG files", done, total),
        )
    full = datasets.build_dataset(spec)
    if min(len(full), opts.samples_per_trial) < max(opts.batch_sizes):
        raise DatasetError(
            f"{spec.name} has {len(full)} samples, fewer than one batch of "
            f"{max(opts.batch_sizes)}; use a smaller --batch-size or more data"
        )
    datasets.check_sample(full)
    files = datasets.sample_files(
        full, subset_indices(len(full), opts.samples_per_trial, opts.seed)
    )
    read = max(opts.batch_sizes) * (opts.warmup_steps + opts.steps)
    if opts.cold and opts.samples_per_trial < read:
        progress.warn(
            f"--cold: a trial reads up to {read} samples but its block holds "
            f"{opts.samples_per_trial}, so it reads some twice, from the page cache; "
            f"raise --samples-per-trial to {read} for every read to be cold"
        )
    if files and not opts.cold:
        progress.stage(f"Pre-warming {len(files)} files of the trial subset")
        warmed = datasets.prewarm(files)
        log.info("pre-warmed %.1f MB", warmed / 1e6)
    return spec, len(full)


def _space(
    opts: SearchOptions, usable: int, cuda: bool, progress: Progress, quiet: bool = False
) -> SearchSpace:
    """The search space; ``usable`` is the CPUs of the largest node a trial may run on."""
    max_workers = usable if opts.max_workers is None else opts.max_workers
    if max_workers > usable:
        if not quiet:
            progress.warn(
                f"--max-workers {max_workers} is more than the {usable} usable CPUs; using {usable}"
            )
        max_workers = usable
    return SearchSpace(
        max_workers=max_workers, batch_sizes=tuple(opts.batch_sizes), cuda=cuda, usable_cpus=usable
    )


def _gpus_per_trial(opts: SearchOptions, cuda: bool) -> float:
    if opts.gpus_per_trial is None:
        return 0.5 if cuda else 0.0
    present = hardware.gpu_info()["gpu_count"]
    if opts.gpus_per_trial > present and not opts.address:
        raise ConfigError(
            f"--gpus-per-trial {opts.gpus_per_trial} but this machine has {present} GPUs; "
            "use a smaller value (0 on a CPU-only machine)"
        )
    return opts.gpus_per_trial


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


def run_search(opts: SearchOptions, progress: Progress | None = None) -> SearchResult:
    """Run the whole search; raises a RaytuneLoaderError subclass on bad input or failure."""
    from raytune_loader import tuner  # Ray is imported only once the input is known good

    progress = progress or LogProgress()
    opts.validate()
    started = time.time()
    cuda = hardware.cuda_available()
    gpus_per_trial = _gpus_per_trial(opts, cuda)
    model = opts.model or default_model(cuda)
    validate_model(model)
    if not opts.address:  # on a cluster the bounds follow its nodes, known once joined
        _space(opts, hardware.usable_cpus(), cuda and gpus_per_trial > 0, progress)
    spec = datasets.DatasetSpec(opts.dataset, opts.data_root, opts.download, opts.synthetic_images)
    out_dir = Path(opts.out) / spec.slug
    ensure_writable(out_dir)
    spec, _ = _prepare_data(opts, progress)
    if not _is_loopback(opts.dashboard_host):
        progress.warn(
            f"the Ray dashboard listens on {opts.dashboard_host}: anyone who can reach it and "
            "has the token in ~/.ray/auth_token can run code on this machine"
        )
    cluster = tuner.start_ray(
        opts.address, opts.dashboard_host, hardware.usable_cpus(), opts.verbose, opts.node_type
    )
    try:
        where = "the cluster's" if cluster.joined else "Ray"
        if cluster.dashboard_url:
            progress.stage(
                f"{where} dashboard: {cluster.dashboard_url} (token in ~/.ray/auth_token)"
            )
        else:
            progress.warn("Ray dashboard not available (install ray[default] to watch trials)")
        node_cpus = int(cluster.node_cpus) if cluster.joined else hardware.usable_cpus()
        space = _space(opts, node_cpus, cuda and gpus_per_trial > 0, progress, quiet=True)
        job = TrialJob(
            dataset=spec,
            model=model,
            segment=SegmentSpec(
                opts.warmup_steps,
                opts.steps,
                opts.report_every,
                opts.compute_threads,
                time_limit_s=opts.trial_timeout_s,
            ),
            device="cuda" if space.cuda else "cpu",
            samples_per_trial=opts.samples_per_trial,
            seed=opts.seed,
            min_batch_size=opts.min_batch_size,
            cpus_per_worker=opts.cpus_per_worker,
            node_cpus=cluster.node_cpus,
            cold=opts.cold,
            gpu_memory_share=gpus_per_trial if 0 < gpus_per_trial < 1 else 1.0,
        )
        job = _with_ceilings(job, space, cluster.bundle(1, gpus_per_trial), progress)
        max_concurrent = opts.max_concurrent or _default_concurrency(gpus_per_trial, cluster)
        name, storage = _experiment(out_dir, opts, cluster, progress)
        settings = tuner.TuneSettings(
            objective=opts.objective, num_samples=opts.num_samples, max_concurrent=max_concurrent,
            time_budget_s=opts.time_budget_s, gpus_per_trial=gpus_per_trial, seed=opts.seed,
            storage=storage, name=name, resume=opts.resume, verbose=opts.verbose,
        )  # fmt: skip
        progress.stage(
            f"Searching {opts.num_samples} configurations of {model} on {spec.name} "
            f"({max_concurrent} at a time, objective {opts.objective})"
        )
        searched = tuner.run_search(job, space, settings, cluster, progress.trial)
        rows = tuner.trial_rows(searched.grid, space)
        # the previous search's trials.csv stays beside its best_config.json until
        # this search has a result of its own
        write_csv(out_dir / "trials.partial.csv", rows, tuner.TRIAL_COLUMNS)
        if searched.interrupted:
            finished = sum(row["status"] != "interrupted" for row in rows)
            raise SearchInterruptedError(
                f"search interrupted after {finished} finished trials, kept in {out_dir}; "
                "continue it with the same command and --resume"
            )
        by_class = _rows_by_class(rows)
        verified = {
            hw_class: _verify(job, space, class_rows, opts, cluster, gpus_per_trial, progress,
                              node_id=_best_node(class_rows, opts.objective, len(by_class)))
            for hw_class, class_rows in by_class.items()
        }  # fmt: skip
    finally:
        tuner.stop_ray()
    context = outcome.Context(
        opts, spec, model, space, job, started, gpus_per_trial, max_concurrent, cluster.joined
    )
    results = {
        hw_class: outcome.best_config(context, candidates, by_class[hw_class])
        for hw_class, candidates in verified.items()
    }
    primary = next(iter(results))  # the class with the most trials
    best = dict(results[primary])
    if len(results) > 1:
        best["per_class"] = {c: f"{c}/best_config.json" for c in results}
        for hw_class, result in results.items():
            folder = out_dir / hw_class
            write_json(folder / "best_config.json", result)
            write_csv(folder / "trials.csv", by_class[hw_class], tuner.TRIAL_COLUMNS)
            _write_report(folder)
        progress.stage(f"Trials ran on {len(results)} hardware classes; results per class in "
                       f"{out_dir}/<class>/")  # fmt: skip
    write_json(out_dir / "best_config.json", best)
    write_csv(out_dir / "trials.csv", rows, tuner.TRIAL_COLUMNS)
    (out_dir / "trials.partial.csv").unlink(missing_ok=True)
    _write_report(out_dir)
    return SearchResult(out_dir, best, rows, cluster.dashboard_url)


def _write_report(folder: Path) -> None:
    from raytune_loader.report import write_report

    write_report(folder)


def _rows_by_class(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Trials grouped by the hardware class of their node, largest group first."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("hardware_class"):
            groups.setdefault(row["hardware_class"], []).append(row)
    ordered = dict(sorted(groups.items(), key=lambda item: -len(item[1])))
    # a trial that failed before its first report has no node: count it with the largest
    unplaced = [row for row in rows if not row.get("hardware_class")]
    if not ordered:
        return {"unknown": unplaced}
    next(iter(ordered.values())).extend(unplaced)
    return ordered


def _best_node(rows: list[dict[str, Any]], objective: str, classes: int) -> str | None:
    """With several hardware classes, verify each on the node its best trial ran on."""
    if classes < 2:
        return None
    finished = [r for r in rows if r.get(objective) is not None and r.get("node_id")]
    return max(finished, key=lambda r: r[objective])["node_id"] if finished else None


def _default_concurrency(gpus_per_trial: float, cluster: Any) -> int:
    """Trials side by side: GPU slices on a GPU or a cluster; one at a time on one CPU machine,
    whose cores they would share."""
    if gpus_per_trial:
        return max(1, int(cluster.gpus / gpus_per_trial))
    return cluster.nodes if cluster.joined else 1


def _experiment(
    out_dir: Path, opts: SearchOptions, cluster: Any, progress: Progress
) -> tuple[str, str]:
    """(name, storage) of the Tune experiment: a new one, or the last one on --resume."""
    pointer = out_dir / "last_search.json"
    if opts.resume:
        try:
            last = json.loads(pointer.read_text())
            return last["name"], last["storage"]
        except (OSError, ValueError, KeyError):
            raise ConfigError(f"nothing to resume under {out_dir}; run without --resume") from None
    name = "search-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    storage = _storage(opts, out_dir, cluster, progress)
    write_json(pointer, {"name": name, "storage": storage})
    return name, storage


def _with_ceilings(
    job: TrialJob, space: SearchSpace, bundle: dict[str, float], progress: Progress
) -> TrialJob:
    from raytune_loader.trainable import ceiling_once

    what = "measuring the ceiling (model on a resident batch)"
    ceilings: dict[int, float] = {}
    for i, batch_size in enumerate(space.batch_sizes):
        progress.count(what, i, len(space.batch_sizes))
        try:
            effective, speed = ceiling_once(job, batch_size, bundle)
        except UserInputError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever failed, the search cannot go on
            raise SearchFailedError(
                f"cannot measure the model's ceiling: {last_line(exc)}"
            ) from None
        ceilings[effective] = speed
        if effective != batch_size:
            progress.warn(f"ceiling: batch size {batch_size} ran out of memory; {effective} fits")
    progress.count(what, len(space.batch_sizes), len(space.batch_sizes))
    return replace(job, ceilings=ceilings)


def _verify(
    job: TrialJob,
    space: SearchSpace,
    rows: list[dict[str, Any]],
    opts: SearchOptions,
    cluster: Any,
    gpus_per_trial: float,
    progress: Progress,
    node_id: str | None = None,
) -> list[Candidate]:
    """Re-measure the top configurations and both baselines, interleaved, one at a time.

    On a cluster with several hardware classes this runs once per class, pinned to
    ``node_id``; the baselines and reservations then follow that node's CPUs.
    """
    from raytune_loader.trainable import measure_once

    node_cpus = job.node_cpus
    if node_id:
        node_cpus = float(next(r["node_cpus"] for r in rows if r.get("node_id") == node_id))
        space = replace(space, usable_cpus=int(node_cpus))
    named: dict[str, LoaderConfig] = dict(space.baselines())
    ranked = sorted(
        (r for r in rows if r["status"] in ("ok", "stopped_early") and r.get(opts.objective)),
        key=lambda r: (r["status"] == "ok", r[opts.objective]),
        reverse=True,
    )
    for row in ranked:
        if len(named) >= 2 + opts.verify_top:
            break
        config = LoaderConfig.from_trial_config(row)
        if config not in named.values():
            named[f"top-{len(named) - 1}"] = config
    # the whole accelerator: no other trial runs during verification
    gpus = min(1.0, cluster.max_node_gpus) if gpus_per_trial else 0.0
    outcomes: dict[str, list[Any]] = {name: [] for name in named}
    order = list(named)
    total = len(order) * opts.verify_repeats
    what = "verifying (each configuration alone, repeated)"
    for done, (_, name) in enumerate(rotated(order, opts.verify_repeats)):
        progress.count(what, done, total)
        config = named[name]
        cpus = reserved_cpus(config.num_workers, job.cpus_per_worker, node_cpus)
        slot = opts.num_samples + done  # --cold: verification reads unread samples too
        bundle = cluster.bundle(cpus, gpus)
        outcomes[name].append(measure_once(job, config, bundle, slot, node_id))
    progress.count(what, total, total)
    return [Candidate(name, named[name], tuple(outcomes[name])) for name in order]
