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
import importlib.metadata
import ipaddress
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from raytune_loader import datasets, hardware, synthetic
from raytune_loader.errors import (
    BatchSizeTooSmallError,
    ConfigError,
    SearchFailedError,
    SearchInterruptedError,
)
from raytune_loader.measure import (
    DataPipelineError,
    SegmentSpec,
    TrialJob,
    last_line,
    subset_indices,
)
from raytune_loader.models import default_model, validate_model
from raytune_loader.results import ensure_writable, write_csv, write_json
from raytune_loader.selection import Candidate, Selection, select
from raytune_loader.space import HEURISTIC, PYTORCH_DEFAULT, LoaderConfig, SearchSpace

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
    steps: int = 30
    warmup_steps: int = 5
    report_every: int = 10
    samples_per_trial: int = 1024
    compute_threads: int = 1
    verify_top: int = 3
    verify_repeats: int = 3
    out: str = "results"
    address: str | None = None
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


def _versions() -> dict[str, str]:
    names = ("ray", "optuna", "torch", "torchvision", "raytune_loader")
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "unknown"
    return out


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
    files = datasets.sample_files(
        full, subset_indices(len(full), opts.samples_per_trial, opts.seed)
    )
    if files and not opts.cold:
        progress.stage(f"Pre-warming {len(files)} files of the trial subset")
        warmed = datasets.prewarm(files)
        log.info("pre-warmed %.1f MB", warmed / 1e6)
    return spec, len(full)


def _space(opts: SearchOptions, usable: int, cuda: bool, progress: Progress) -> SearchSpace:
    max_workers = usable if opts.max_workers is None else opts.max_workers
    if max_workers > usable:
        progress.warn(
            f"--max-workers {max_workers} is more than the {usable} usable CPUs; using {usable}"
        )
        max_workers = usable
    return SearchSpace(
        max_workers=max_workers, batch_sizes=tuple(opts.batch_sizes), cuda=cuda, usable_cpus=usable
    )


def run_search(opts: SearchOptions, progress: Progress | None = None) -> SearchResult:
    """Run the whole search; raises a RaytuneLoaderError subclass on bad input or failure."""
    from raytune_loader import tuner  # Ray is imported only once the input is known good

    progress = progress or LogProgress()
    opts.validate()
    started = time.time()
    cuda = hardware.cuda_available()
    gpus_present = hardware.gpu_info()["gpu_count"]
    gpus_per_trial = (
        opts.gpus_per_trial if opts.gpus_per_trial is not None else (0.5 if cuda else 0)
    )
    if gpus_per_trial > max(gpus_present, 0) and not opts.address:
        raise ConfigError(
            f"--gpus-per-trial {gpus_per_trial} but this machine has {gpus_present} GPUs; "
            "use a smaller value (0 on a CPU-only machine)"
        )
    model = opts.model or default_model(cuda)
    validate_model(model)
    usable = hardware.usable_cpus()
    space = _space(opts, usable, cuda and gpus_per_trial > 0, progress)
    spec = datasets.DatasetSpec(opts.dataset, opts.data_root, opts.download, opts.synthetic_images)
    out_dir = Path(opts.out) / spec.slug
    ensure_writable(out_dir)
    spec, dataset_len = _prepare_data(opts, progress)

    if not _is_loopback(opts.dashboard_host):
        progress.warn(
            f"the Ray dashboard listens on {opts.dashboard_host}: anyone who can reach it and "
            "has the token in ~/.ray/auth_token can run code on this machine"
        )
    cluster = tuner.start_ray(opts.address, opts.dashboard_host, usable, opts.verbose)
    try:
        if cluster.dashboard_url:
            progress.stage(f"Ray dashboard: {cluster.dashboard_url} (token in ~/.ray/auth_token)")
        else:
            progress.warn("Ray dashboard not available (install ray[default] to watch trials)")
        job = TrialJob(
            dataset=spec,
            model=model,
            segment=SegmentSpec(
                opts.warmup_steps, opts.steps, opts.report_every, opts.compute_threads
            ),
            device="cuda" if space.cuda else "cpu",
            samples_per_trial=opts.samples_per_trial,
            seed=opts.seed,
            min_batch_size=opts.min_batch_size,
            cpus_per_worker=opts.cpus_per_worker,
            node_cpus=cluster.node_cpus,
            cold=opts.cold,
        )
        job = _with_ceilings(job, space, gpus_per_trial, progress)
        max_concurrent = opts.max_concurrent or _default_concurrency(space.cuda, gpus_per_trial)
        name = _experiment_name(out_dir, opts.resume)
        settings = tuner.TuneSettings(
            objective=opts.objective, num_samples=opts.num_samples, max_concurrent=max_concurrent,
            time_budget_s=opts.time_budget_s, gpus_per_trial=gpus_per_trial, seed=opts.seed,
            storage_path=(out_dir / "tune").resolve(), name=name, resume=opts.resume,
            verbose=opts.verbose,
        )  # fmt: skip
        progress.stage(
            f"Searching {opts.num_samples} configurations of {model} on {spec.name} "
            f"({max_concurrent} at a time, objective {opts.objective})"
        )
        searched = tuner.run_search(job, space, settings, cluster, progress.trial)
        rows = tuner.trial_rows(searched.grid, space)
        write_csv(out_dir / "trials.csv", rows, tuner.TRIAL_COLUMNS)
        if searched.interrupted:
            finished = sum(row["status"] != "interrupted" for row in rows)
            raise SearchInterruptedError(
                f"search interrupted after {finished} finished trials, kept in {out_dir}; "
                "continue it with the same command and --resume"
            )
        candidates = _verify(job, space, rows, opts, gpus_per_trial, cluster.gpus, progress)
    finally:
        tuner.stop_ray()
    selection = select(candidates, opts.objective)
    if selection is None:
        reasons = sorted({r["reason"] for r in rows if r["reason"]}) or ["no trial finished"]
        raise SearchFailedError(f"every configuration failed: {'; '.join(reasons)[:400]}")
    best = _best_config(opts, spec, model, space, selection, candidates, rows, job, started,
                        gpus_per_trial, max_concurrent)  # fmt: skip
    write_json(out_dir / "best_config.json", best)
    from raytune_loader.report import write_report

    write_report(out_dir)
    return SearchResult(out_dir, best, rows, cluster.dashboard_url)


def _default_concurrency(cuda: bool, gpus_per_trial: float) -> int:
    """Trials side by side: GPU slices on a GPU; one at a time on a CPU, whose cores they share."""
    if cuda and gpus_per_trial:
        return max(1, int(hardware.gpu_info()["gpu_count"] / gpus_per_trial))
    return 1


def _experiment_name(out_dir: Path, resume: bool) -> str:
    latest = out_dir / "tune" / "LATEST"
    if resume:
        if not latest.exists():
            raise ConfigError(f"nothing to resume under {out_dir}; run without --resume")
        return latest.read_text().strip()
    name = "search-" + dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    latest.parent.mkdir(parents=True, exist_ok=True)
    latest.write_text(name + "\n")
    return name


def _with_ceilings(job: TrialJob, space: SearchSpace, gpus: float, progress: Progress) -> TrialJob:
    from raytune_loader.trainable import ceiling_once

    ceilings: dict[int, float] = {}
    for i, batch_size in enumerate(space.batch_sizes, 1):
        progress.count(
            "measuring the ceiling (model on a resident batch)", i - 1, len(space.batch_sizes)
        )
        try:
            effective, speed = ceiling_once(job, batch_size, gpus)
        except (DataPipelineError, BatchSizeTooSmallError) as exc:  # Ray re-raises the type
            raise SearchFailedError(
                f"cannot measure the model's ceiling: {last_line(exc)}"
            ) from None
        ceilings[effective] = speed
        if effective != batch_size:
            progress.warn(f"ceiling: batch size {batch_size} ran out of memory; {effective} fits")
    progress.count(
        "measuring the ceiling (model on a resident batch)",
        len(space.batch_sizes),
        len(space.batch_sizes),
    )
    return replace(job, ceilings=ceilings)


def _verify(
    job: TrialJob,
    space: SearchSpace,
    rows: list[dict[str, Any]],
    opts: SearchOptions,
    gpus_per_trial: float,
    gpus: float,
    progress: Progress,
) -> list[Candidate]:
    """Re-measure the top configurations and both baselines, interleaved, one at a time."""
    from raytune_loader.space import reserved_cpus
    from raytune_loader.trainable import measure_once

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
    whole_gpu = 1.0 if gpus_per_trial and gpus >= 1 else gpus_per_trial
    outcomes: dict[str, list[Any]] = {name: [] for name in named}
    order = list(named)
    total, done = len(order) * opts.verify_repeats, 0
    for repeat in range(opts.verify_repeats):
        shift = repeat % len(order)  # rotate so drift hits every candidate alike
        for name in order[shift:] + order[:shift]:
            progress.count("verifying (each configuration alone, repeated)", done, total)
            config = named[name]
            cpus = reserved_cpus(config.num_workers, job.cpus_per_worker, job.node_cpus)
            slot = opts.num_samples + done  # --cold: verification reads unread samples too
            outcomes[name].append(measure_once(job, config, cpus, whole_gpu, slot))
            done += 1
    progress.count("verifying (each configuration alone, repeated)", total, total)
    return [Candidate(name, named[name], tuple(outcomes[name])) for name in order]


def _metrics(candidate: Candidate, objective: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in ("samples_per_s", "data_wait_frac", "util"):
        stats = candidate.stats(metric)
        out[metric] = stats.as_dict() if stats else None
    sources = {o.metrics.util_source for o in candidate.ok if o.metrics}
    out["util_source"] = sources.pop() if len(sources) == 1 else ",".join(sorted(sources)) or None
    ceilings = [o.ceiling_samples_per_s for o in candidate.ok if o.ceiling_samples_per_s]
    out["ceiling_samples_per_s"] = ceilings[0] if ceilings else None
    efficiency = candidate.efficiency()
    out["efficiency"] = efficiency.as_dict() if efficiency else None
    failures = [o.failure for o in candidate.outcomes if o.failure]
    if failures:
        out["failures"] = failures
    return out


def _speedup(winner: Candidate, baseline: Candidate | None) -> float | None:
    if baseline is None:
        return None
    mine, theirs = winner.stats("samples_per_s"), baseline.stats("samples_per_s")
    if mine is None or theirs is None or theirs.median == 0:
        return None
    return mine.median / theirs.median


def _best_config(
    opts: SearchOptions,
    spec: datasets.DatasetSpec,
    model: str,
    space: SearchSpace,
    selection: Selection,
    candidates: list[Candidate],
    rows: list[dict[str, Any]],
    job: TrialJob,
    started: float,
    gpus_per_trial: float,
    max_concurrent: int,
) -> dict[str, Any]:
    by_name = {c.name: c for c in candidates}
    winner = selection.winner
    statuses = [r["status"] for r in rows]
    return {
        "schema_version": 1,
        "dataset": spec.name,
        "model": model,
        "objective": opts.objective,
        "loader": winner.config.kwargs(),
        "metrics": _metrics(winner, opts.objective),
        "cost": {"cpus_reserved": winner.cost[0], "host_bytes_in_flight": winner.cost[1]},
        "selection": {
            "chosen": winner.name,
            "rule": "cheapest (fewest CPUs, then least host memory) among configurations "
            "whose verified median objective is within noise of the best",
            "decided_by_cost": selection.decided_by_cost,
            "best_by_objective": selection.best_by_objective.name,
            "runners_up": [
                {
                    "name": c.name,
                    "loader": c.config.kwargs(),
                    "objective": c.stats(opts.objective).as_dict(),
                }  # type: ignore[union-attr]
                for c in selection.ranked
                if c is not winner
            ],
        },
        "baselines": {
            name: {
                "loader": by_name[name].config.kwargs(),
                "metrics": _metrics(by_name[name], opts.objective),
            }
            for name in (PYTORCH_DEFAULT, HEURISTIC)
        },
        "speedup": {
            "vs_pytorch_default": _speedup(winner, by_name.get(PYTORCH_DEFAULT)),
            "vs_heuristic": _speedup(winner, by_name.get(HEURISTIC)),
            "metric": "samples_per_s (median of verification runs)",
        },
        "hardware": hardware.hardware_info(),
        "search": {
            "trials": len(rows),
            "ok": statuses.count("ok"),
            "errored": statuses.count("error") + statuses.count("failed"),
            "stopped_early": statuses.count("stopped_early"),
            "oom_backoffs": sum(int(r.get("oom_backoffs") or 0) for r in rows),
            "wall_time_s": round(time.time() - started, 1),
            "sampler": f"optuna TPESampler(seed={opts.seed})",
            "scheduler": f"ASHA(max_t={job.segment.reports}, grace_period=1, reduction_factor=2)",
            "max_concurrent": max_concurrent,
            "gpus_per_trial": gpus_per_trial,
            "cpus_per_worker": opts.cpus_per_worker,
            "space": {
                "max_workers": space.max_workers,
                "batch_sizes": list(space.batch_sizes),
                "prefetch_factors": list(space.prefetch_factors),
                "pin_memory": space.cuda,
            },
            "segment": asdict(job.segment),
            "samples_per_trial": opts.samples_per_trial,
            "dataset_spec": asdict(spec),
            "device": job.device,
            "seed": opts.seed,
            "verification": {"top": opts.verify_top, "repeats": opts.verify_repeats},
            "versions": _versions(),
        },
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
