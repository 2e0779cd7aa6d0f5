"""The content of best_config.json: the verified winner, both baselines, how it ran.

Built from the verification measurements (:mod:`raytune_loader.verdict.selection`) and the
trial records of one hardware class; the schema is the contract in docs/best_config.md.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.engines import Verdict, engine_of
from raytune_loader.errors import (
    CORRUPT_FIX,
    DatasetError,
    RaytuneLoaderError,
    SearchFailedError,
    corrupt_said,
)
from raytune_loader.files import write_json
from raytune_loader.machine import hardware
from raytune_loader.measuring import records, shards, steady
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.outcomes import InputRate
from raytune_loader.measuring.profile import Profile
from raytune_loader.measuring.records import TrialRecord
from raytune_loader.outputs import trainers
from raytune_loader.outputs.reader import SCHEMA_VERSION
from raytune_loader.outputs.report import write_report
from raytune_loader.outputs.study import STUDY_FILE, write_study
from raytune_loader.progress import Progress
from raytune_loader.tuning.costmodel import CostModel, what_if
from raytune_loader.tuning.options import SearchOptions
from raytune_loader.tuning.space import (
    HEURISTIC,
    PYTORCH_DEFAULT,
    RANK_SHARE,
    RAY_DOCS,
    SearchSpace,
)
from raytune_loader.verdict import findings
from raytune_loader.verdict.selection import Candidate, Selection, fitting, select
from raytune_loader.verdict.verify import Verified

CLASS_FACTS = ("hardware_class", "cpu_model", "node_cpus", "gpu_name", "node_gpus", "ram_bytes")


@dataclass(frozen=True)
class SearchContext:
    """What the search was, for the record."""

    opts: SearchOptions
    space: SearchSpace
    job: TrialJob
    started: float
    gpus_per_trial: float
    max_concurrent: int
    joined: bool
    sampler: str  # as the searcher describes itself
    scheduler: str  # as the tuner describes ASHA
    search: dict[str, Any] = field(default_factory=dict)  # how the searcher proposed
    model: CostModel | None = None  # the cost model of a model-guided search
    # the share of this machine's CPU time its hypervisor gave to other guests while
    # the search ran (a local search; None on a cluster, whose trials ran elsewhere)
    cpu_steal_frac: float | None = None


def _versions() -> dict[str, str]:
    names = ("ray", "optuna", "torch", "torchvision", "raytune_loader")
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "unknown"
    return out


def metrics_of(candidate: Candidate) -> dict[str, Any]:
    """A verified candidate's figures as ``best_config.json`` records them: each metric's
    spread, the utilization's source, the ceilings and efficiency, the steady window."""
    out: dict[str, Any] = {}
    for metric in ("samples_per_s", "data_wait_frac", "util", "first_batch_s"):
        stats = candidate.stats(metric)
        out[metric] = stats.as_dict() if stats else None
    if candidate.config.cache:  # its first, cold epoch, apart from the warm ones above
        stats = candidate.stats("cold_samples_per_s")
        out["cold_samples_per_s"] = stats.as_dict() if stats else None
    sources = {o.metrics.util_source for o in candidate.ok if o.metrics}
    out["util_source"] = sources.pop() if len(sources) == 1 else ",".join(sorted(sources)) or None
    out["ceiling_samples_per_s"] = _ceiling(candidate)
    efficiency = candidate.efficiency()
    out["efficiency"] = efficiency.as_dict() if efficiency else None
    if efficiency and efficiency.median > 1:  # never a result: the ceiling was too low
        out["efficiency"] = None
        out["ceiling_note"] = (
            f"the ceiling ({out['ceiling_samples_per_s']:.0f} samples/s) measured below this "
            f"loader's speed (median efficiency {efficiency.median:.2f}): it was measured too "
            "low, so efficiency is not reported"
        )
    effective = {o.effective_batch_size for o in candidate.ok}
    out["requested_batch_size"] = candidate.config.batch_size
    out["effective_batch_size"] = min(effective) if effective else None
    out["oom_backoffs"] = sum(o.oom_backoffs for o in candidate.ok)
    failures = [o.failure for o in candidate.outcomes if o.failure]
    if failures:
        out["failures"] = failures
    out.update(steady_section(candidate))
    return out


def steady_section(candidate: Candidate) -> dict[str, Any]:
    """Whether the runs' windows were steady, and the runs left out for beating a bound."""
    ratios = [o.metrics.steady_ratio for o in candidate.ok if o.metrics]
    out: dict[str, Any] = {
        "steady": candidate.steady,
        "steady_ratios": [None if r is None else round(r, 4) for r in ratios],
        "steady_rule": (
            f"the window's halves within {steady.STEADY_TOLERANCE:.0%} of each other, in at "
            "least half the runs; the window starts after the warm-up steps and as many "
            "batches as the loader holds"
        ),
    }
    if candidate.refused:
        out["refused"] = list(candidate.refused)
    return out


INPUT_BOUND_MARGIN = 0.15  # the input alone within 15% of training: the input is the limit
# a loop waiting for data this share of its window is not model-bound, however fast the
# input alone is: beside the step the workers do not do what they do alone (on a CPU
# they share its cores: shards from a bucket trained at 249 samples/s waiting 53% of
# the time, where the input alone gave 776)
WAITING_SHARE = 0.25
# training within 20% of the ceiling: the model is the limit. Further below it, neither
# alone is: the default search trained 758 samples/s without waiting, where the model
# alone did 1127 and the input alone 1252 (on a CPU the step and the workers share cores).
# 20%, not 15%: the ceiling kept is the highest of several, and on a shared VM one
# process's ceiling spread 1.226x (results/benchmarks/ceiling_noise.json)
MODEL_MARGIN = 0.2


def _limit(winner: Candidate, rate: InputRate | None, device: str = "cpu") -> dict[str, Any]:
    """Where the limit is: the input pipeline alone and the model alone (the ceiling)
    against the trained rate, and what the training loop waited."""
    trained = winner.stats("samples_per_s")
    if rate is None or trained is None or not trained.median:
        return {}
    headroom = rate.samples_per_s / trained.median - 1
    defect = steady.above_bound(
        trained.median, rate.samples_per_s, "the input pipeline alone (no model)"
    )
    waited = winner.stats("data_wait_frac")
    waiting = waited.median if waited is not None else None
    ceiling = _ceiling(winner)
    share = trained.median / ceiling if ceiling else None
    if headroom < INPUT_BOUND_MARGIN:
        bound = "input"
    elif waiting is not None and waiting >= WAITING_SHARE:
        bound = "shared"
    elif share is not None and share < 1 - MODEL_MARGIN:
        bound = "contended"
    else:
        bound = "model"
    return {
        "limit": {
            "bound": "defect" if defect else bound,
            **({"defect": defect} if defect else {}),
            "input_samples_per_s": rate.samples_per_s,
            "trained_samples_per_s": trained.median,
            "headroom": headroom,
            "ceiling_samples_per_s": ceiling,
            "ceiling_share": share,
            "device": device,
            "data_wait_frac": waiting,
            "per_core_samples_per_s": rate.per_core,
            "rule": f"input-bound when the input pipeline alone (no model) is within "
            f"{INPUT_BOUND_MARGIN:.0%} of the trained rate; shared when it is further above "
            f"but training waited for data {WAITING_SHARE:.0%} of the time or more; "
            f"model-bound when training is within {MODEL_MARGIN:.0%} of the ceiling (the "
            "model alone, on a resident batch) or the ceiling is unknown; contended "
            "otherwise (each alone is faster than the two together)",
        }
    }


def _ceiling(candidate: Candidate) -> float | None:
    """The ceiling the candidate's runs were judged against (the search's final one)."""
    return next((o.ceiling_samples_per_s for o in candidate.ok if o.ceiling_samples_per_s), None)


def _median(candidate: Candidate, metric: str) -> float | None:
    stats = candidate.stats(metric)
    return stats.median if stats else None


def _speedup(winner: Candidate, baseline: Candidate | None) -> float | None:
    if baseline is None:
        return None
    mine, theirs = winner.stats("samples_per_s"), baseline.stats("samples_per_s")
    if mine is None or theirs is None or theirs.median == 0:
        return None
    return mine.median / theirs.median


def _hardware(ctx: SearchContext, records: list[TrialRecord]) -> dict[str, Any]:
    """This machine's facts; on a cluster, those of the class the trials ran on."""
    if not ctx.joined:
        steal = ctx.cpu_steal_frac
        return {**hardware.hardware_info(),
                "cpu_steal_frac": None if steal is None else round(steal, 4)}  # fmt: skip
    node = next((r.node for r in records if r.node.hardware_class), None)
    facts = asdict(node) if node else {}
    return {key: facts.get(key) for key in CLASS_FACTS} | {
        "usable_cpus": facts.get("node_cpus"),
        "gpu_count": facts.get("node_gpus"),
        "torch": hardware.hardware_info()["torch"],
    }


def _all_failed(records: Sequence[TrialRecord]) -> RaytuneLoaderError:
    """Every configuration failed: the first trial's reason whole, and how many others
    ``trials.partial.csv`` (kept) holds. Where every one was a corrupt sample, the data
    is at fault: a DatasetError naming the file (the checks before the trials read only
    some)."""
    first: dict[str, str] = {}  # one corrupt file, however a worker or Ray wrapped it, once
    for record in records:
        if record.reason:
            first.setdefault(corrupt_said(record.reason) or record.reason, record.reason)
    reasons = list(first.values())
    if not reasons:
        return SearchFailedError("every configuration failed: no trial finished")
    others = len(reasons) - 1
    more = f" ({others} other reason{'s' * (others > 1)} in trials.partial.csv)" if others else ""
    said = [corrupt_said(r) for r in reasons if r.startswith("corrupt_sample: ")]
    if len(said) == len(reasons) and said[0]:
        return DatasetError(f"every configuration failed on a {said[0]}; {CORRUPT_FIX}{more}")
    return SearchFailedError(f"every configuration failed: {reasons[0]}{more}")


def best_config(
    ctx: SearchContext,
    candidates: list[Candidate],
    records: list[TrialRecord],
    input_rates: dict[str, InputRate] | None = None,
    rounds: int | None = None,
    probes: Sequence[Candidate] = (),
) -> dict[str, Any]:
    """The best_config.json content; SearchFailedError when every configuration failed.
    ``probes`` are the winner's variants the findings measured
    (:mod:`~raytune_loader.verdict.findings`)."""
    selection = select(candidates, ctx.opts.objective)
    if selection is None:
        raise _all_failed(records)
    by_name = {c.name: c for c in candidates}
    winner = selection.winner
    loader = _dataloader(selection, by_name)  # what .dataloader() builds
    rules = findings.Rules(ctx.opts.memory_share, ctx.opts.cpus_per_worker)
    statuses = [r.status for r in records]
    return {
        "schema_version": SCHEMA_VERSION,
        "dataset": ctx.job.dataset.name,
        "model": None if ctx.job.train_step else ctx.job.model,  # the step is in "job"
        "objective": ctx.opts.objective,
        "engine": engine_of(winner.config).name,  # the chosen candidate's: dataloader or raydata
        "ranks_per_node": ctx.job.ranks,  # the loader below is each rank's
        # after an out-of-memory back-off, what fits is what training should use
        "loader": fitting(loader).kwargs(),
        "worker_init": loader.config.worker_init(),  # what .dataloader()'s workers set
        "metrics": metrics_of(winner),
        **_limit(winner, (input_rates or {}).get(winner.name), ctx.job.device),
        "findings": [
            f.as_dict() for f in findings.findings(winner, probes, records, rules, ctx.model)
        ],
        "watch": findings.watch_section(winner, probes),
        "cost": {"cpus_reserved": winner.cost[0], "host_bytes_in_flight": winner.cost[1]},
        "selection": {
            "chosen": winner.name,
            "rule": "cheapest (fewest CPUs, then least host memory) among configurations "
            "whose verified median objective is within noise of the best",
            "decided_by_cost": selection.decided_by_cost,
            "best_by_objective": selection.best_by_objective.name,
            "runners_up": [
                {**_settings(c), "objective": c.stats(ctx.opts.objective).as_dict()}  # type: ignore[union-attr]
                for c in selection.ranked
                if c is not winner
            ],
        },
        "baselines": _baselines(by_name, ctx.space.heuristic_note, ctx.space.pipeline),
        "speedup": {
            "vs_pytorch_default": _speedup(winner, by_name.get(PYTORCH_DEFAULT)),
            "vs_heuristic": _speedup(winner, by_name.get(HEURISTIC)),
            **(
                {"vs_heuristic_rank_share": _speedup(winner, by_name[RANK_SHARE])}
                if RANK_SHARE in by_name
                else {}
            ),
            **(
                {"vs_ray_docs_default": _speedup(winner, by_name[RAY_DOCS])}
                if RAY_DOCS in by_name
                else {}
            ),
            "metric": "samples_per_s (median of verification runs)",
        },
        **_engine_sections(ctx, selection, loader),
        "job": job_section(ctx.job, ctx.space, fitting(winner).batch_size),
        **({"pipeline": loader.config.pipeline()} if ctx.space.pipeline else {}),
        "source": source_section(
            ctx.job, fitting(winner), winner, ctx.model.profile if ctx.model else None
        ),
        **_what_if(ctx, fitting(winner), _median(winner, "samples_per_s")),
        "trainers": trainers.section(),
        **(
            {"trainer": trainers.hf_section(fitting(loader), ctx.space, ctx.model)}
            if ctx.opts.trainer == "hf"
            else {}
        ),  # fmt: skip
        "hardware": _hardware(ctx, records),
        "search": {
            "trials": len(records),
            "ok": statuses.count("ok"),
            "errored": statuses.count("error") + statuses.count("failed"),
            "stopped_early": statuses.count("stopped_early"),
            "oom_backoffs": sum(r.oom_backoffs or 0 for r in records),
            "wall_time_s": round(time.time() - ctx.started, 1),
            "sampler": ctx.sampler,
            **_search_method(ctx),
            "scheduler": ctx.scheduler,
            "max_concurrent": ctx.max_concurrent,
            "gpus_per_trial": ctx.gpus_per_trial,
            "cpus_per_worker": ctx.opts.cpus_per_worker,
            "space": {
                "max_workers": ctx.space.max_workers,
                "batch_sizes": list(ctx.space.batch_sizes),
                "prefetch_factors": list(ctx.space.prefetch_factors),
                "pin_memory": ctx.space.cuda,
                "raydata_cpus": ctx.space.raydata_cpus,
            },
            "segment": asdict(ctx.job.segment),
            "samples_per_trial": ctx.opts.samples_per_trial,
            "dataset_spec": asdict(ctx.job.dataset),  # storage options hold no credential
            "device": ctx.job.device,
            "seed": ctx.opts.seed,
            "verification": {
                "top": ctx.opts.verify_top,
                "repeats": ctx.opts.verify_repeats,
                "rounds": rounds,  # fewer than repeats where the runs decided sooner
            },  # fmt: skip
            "versions": _versions(),
        },
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _dataloader(selection: Selection, by_name: dict[str, Candidate]) -> Candidate:
    """The DataLoader ``.dataloader()`` builds: the chosen candidate, or where a Ray Data
    candidate was chosen the best verified DataLoader (PyTorch's defaults where none
    measured)."""
    if not engine_of(selection.winner.config).remote:
        return selection.winner
    loaders = [c for c in selection.ranked if not engine_of(c.config).remote]
    return loaders[0] if loaders else by_name[PYTORCH_DEFAULT]


def _settings(candidate: Candidate) -> dict[str, Any]:
    """A verified candidate's settings as the JSON names them: a DataLoader's sections,
    or a Ray Data candidate's ``raydata`` knobs."""
    return {"name": candidate.name, **engine_of(candidate.config).settings()}


def _engine_sections(ctx: SearchContext, selection: Selection, loader: Candidate) -> dict[str, Any]:
    """Each engine's section beside the DataLoader's (:meth:`Engine.section`): its best
    verified candidate, chosen or a runner-up, with its figures and findings."""
    sections: dict[str, Any] = {}
    seen: set[str] = set()
    to_ceiling = ctx.model.remote_cpus(ctx.space) if ctx.model is not None else None
    for candidate in selection.ranked:
        engine = engine_of(fitting(candidate))
        if engine.name in seen:
            continue
        seen.add(engine.name)
        verdict = Verdict(
            chosen=candidate is selection.winner,
            name=candidate.name,
            metrics=metrics_of(candidate),
            speedup_vs_dataloader=_speedup(candidate, loader),
            trial_cpus=ctx.job.cpus_for(0),
            offered_cpus=ctx.space.raydata_cpus,
            cpus_to_ceiling=to_ceiling,
            findings=[f.as_dict() for f in findings.raydata_findings(candidate)],
        )  # fmt: skip
        sections.update(engine.section(verdict))
    return sections


def _search_method(ctx: SearchContext) -> dict[str, Any]:
    """How the searcher proposed; for the model-guided search, the profile and how well
    the model predicted the trials it ran."""
    out: dict[str, Any] = {"method": ctx.search.get("method", ctx.opts.search)}
    if ctx.model is not None:
        out["model"] = {
            **{k: v for k, v in ctx.search.items() if k != "method"},
            "profile": ctx.model.profile.as_dict(),
        }
    return out


def _what_if(
    ctx: SearchContext, config: LoaderConfig, measured: float | None = None
) -> dict[str, Any]:
    """Estimates, from the measured per-core costs, of the winner's structure on bigger
    nodes: where CPUs, not settings, are the limit. The row of this node and the winner's
    own worker count also gives ``measured``, the winner's verified rate."""
    if ctx.model is None:
        return {}
    cores = int(ctx.model.profile.cores)
    sizes = sorted({cores, 2 * cores, 4 * cores, 8 * cores})
    # scaled as the search's trials calibrated the part that bounds each estimate
    factors = ctx.search.get("calibration")
    winner = ctx.model.predict(config)
    nodes = what_if(ctx.model, config, sizes)
    if isinstance(factors, dict) and winner is not None:  # (a float: a development version's)
        for node in nodes:  # keyed by the winner's kind: workers, none, Ray Data
            factor = factors.get(winner.key(str(node["bound"])))
            if factor is not None:
                node["samples_per_s"] = round(float(node["samples_per_s"]) * factor, 1)  # type: ignore[arg-type]
    for node in nodes:
        own = (node.get("cores"), node.get("workers_per_rank")) == (cores, config.num_workers)
        if own and measured:
            node["measured_samples_per_s"] = round(measured, 1)
    return {"what_if": {
        "note": "estimates from the profile's per-core costs, not measurements; each "
                "calibrated as the search's trials bound by the same part measured, where "
                "a trial was",
        "ceiling_samples_per_s": ctx.model.ceilings.get(config.batch_size),
        "nodes": nodes,
    }}  # fmt: skip


def source_section(
    job: TrialJob,
    config: LoaderConfig,
    winner: Candidate | None = None,
    profile: Profile | None = None,
) -> dict[str, Any]:
    """What the data was and how the winner reads it: for a stream, its shards, the
    user's shuffle settings (recorded, never tuned) and where batches are made; for a
    bucket, the store: the request time the winner's runs measured, and the profile's
    time to first byte, bandwidth per request and top request rate."""
    spec = job.dataset
    out: dict[str, Any] = {**spec.source.describe(spec), "access": config.access}
    if config.cache:  # the budget training's cache keeps to (None: half its disk's free)
        out["cache_bytes"] = job.cache_bytes
    if "store" in out and winner is not None:
        request_s = winner.stats("store_request_s")
        out["store"]["request_s"] = request_s.median if request_s else None
    if "store" in out and profile is not None and profile.store_rate:
        out["store"].update(profile.store_latency, top_requests_per_s=round(profile.store_rate))
    if config.access == "stream":
        buffer = shards.variant(job, config).shuffle_buffer
        out.update(
            shuffle_buffer=buffer,
            shard_shuffle=buffer > 0 and job.stream_shards > 0,
            batching=config.batching,
            shards_per_trial=job.stream_shards or None,
        )
    if job.stream_note:
        out["note"] = job.stream_note
    return out


def job_section(job: TrialJob, space: SearchSpace, chosen_batch_size: int) -> dict[str, Any]:
    """What was trained and how, so the bench replays it (``load_best_config`` ignores it).

    A batch size changes training dynamics: the user's own (the first asked) stays
    beside the one that won, and a note says when they differ."""
    requested = space.batch_sizes[0]
    out: dict[str, Any] = {
        "model": job.model,
        "train_step": job.train_step,
        "precision": job.precision,
        "channels_last": job.channels_last,
        "compile": job.compile,
        "device": job.device,
        "compute_threads": job.segment.compute_threads,
        "batch_sizes_asked": list(space.batch_sizes),
        "requested_batch_size": requested,
    }
    if chosen_batch_size != requested:
        out["batch_size_note"] = (
            f"the tuned loader uses batch size {chosen_batch_size}, not your {requested}: a "
            "candidate, since it changes training dynamics (learning rate, normalization); "
            f"keep yours with .dataloader(dataset, batch_size={requested})"
        )
    return out


def _baselines(
    by_name: dict[str, Candidate], heuristic_note: str | None, pipeline: bool
) -> dict[str, Any]:
    """The baselines' settings and figures; their ``pipeline`` where the winner's is
    written (``pipeline``): on a stream a baseline reads the stream, as the winner does."""
    out: dict[str, Any] = {
        name: {
            "loader": by_name[name].config.kwargs(),
            **({"pipeline": by_name[name].config.pipeline()} if pipeline else {}),
            "metrics": metrics_of(by_name[name]),
        }
        for name in (PYTORCH_DEFAULT, HEURISTIC, RANK_SHARE)
        if name in by_name
    }
    if RAY_DOCS in by_name:
        docs = by_name[RAY_DOCS]
        out[RAY_DOCS] = {"raydata": docs.config.raydata_values(), "metrics": metrics_of(docs)}
    if heuristic_note:
        out[HEURISTIC]["note"] = heuristic_note
    return out


def write_results(
    out_dir: Path,
    context: SearchContext,
    by_class: dict[str, list[TrialRecord]],
    verified: dict[str, Verified],
    progress: Progress,
) -> tuple[dict[str, Any], list[TrialRecord]]:
    """Write ``best_config.json``, ``trials.csv`` and the report into ``out_dir`` (per
    hardware class too, when the trials ran on several), every trial as an Optuna study
    (``study.journal``, for optuna-dashboard), and drop the interrupted search's
    partial files.

    Args:
        out_dir: the results folder of the dataset.
        context: how the search ran.
        by_class: the trials, by hardware class (the one with the most first).
        verified: each class's verification.
        progress: where the folders written are said.

    Returns:
        The content of the top ``best_config.json``, and every trial's record.
    """
    rebased = {  # a class left unverified (its nodes gone) keeps its trials' own ceilings
        hw_class: [r.rebased(verified[hw_class].ceilings.get(r.effective_batch_size or 0))
                   if hw_class in verified else r for r in class_records]
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
            write_folder(out_dir / hw_class, result, rebased[hw_class])
        progress.stage(f"Trials ran on {len(results)} hardware classes; results per class in "
                       f"{out_dir}/<class>/")  # fmt: skip
    trials = sorted(
        (r for class_records in rebased.values() for r in class_records),
        key=lambda r: r.finished_at or 0,
    )
    write_folder(out_dir, best, trials)
    study_name = f"raytune_loader-{context.job.dataset.name}"
    write_study(out_dir / STUDY_FILE, context.space, trials, context.opts.objective, study_name)
    (out_dir / "trials.partial.csv").unlink(missing_ok=True)
    return best, trials


def write_folder(folder: Path, best: dict[str, Any], trials: list[TrialRecord]) -> None:
    """One result folder: ``best_config.json`` (atomically), ``trials.csv``, the report."""
    write_json(folder / "best_config.json", best)
    records.write_trials_csv(folder / "trials.csv", trials)
    write_report(folder)
