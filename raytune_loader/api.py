"""The search as a Python API: options in, ``best_config.json`` and friends out.

:func:`run_search` is what ``python -m raytune_loader.search`` runs, phase by phase, each
phase its room's: the options checked and the job built (:mod:`raytune_loader.tuning.setup`),
the data made ready (:mod:`raytune_loader.measuring.prepare`), Ray started or joined and
the search sized to it (the ceiling, the profile, the space), the Tune search
(:mod:`raytune_loader.tuning.tuner`), each hardware class verified
(:mod:`raytune_loader.verdict.classes`), and ``results/<dataset>/`` written
(:mod:`raytune_loader.outputs.bestconfig`). Progress goes to a
:class:`~raytune_loader.progress.Progress` object, so the command line can show it and
the API can log it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from raytune_loader.errors import DatasetError, SearchFailedError, SearchInterruptedError
from raytune_loader.files import remove_if_empty
from raytune_loader.machine import hardware
from raytune_loader.measuring import records
from raytune_loader.measuring.measure import search_cache
from raytune_loader.measuring.prepare import prepare_data
from raytune_loader.measuring.records import TrialRecord
from raytune_loader.outputs.bestconfig import SearchContext, write_results
from raytune_loader.progress import LogProgress, Progress
from raytune_loader.tuning import setup
from raytune_loader.tuning.options import SearchOptions
from raytune_loader.verdict.classes import verify_classes


@dataclass(frozen=True)
class SearchResult:
    """What :func:`run_search` returns: the results folder, the content of its
    ``best_config.json``, every trial's record, and the Ray dashboard's URL (None where it
    did not start)."""

    out_dir: Path
    best_config: dict[str, Any]
    trials: list[TrialRecord] = field(default_factory=list)
    dashboard_url: str | None = None


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
    progress = progress or LogProgress()
    started = time.time()
    search = setup.checked(opts, progress)
    try:
        return _searched(search, progress, started, hardware.cpu_time_stolen())
    except (SearchFailedError, DatasetError):  # the data, or every configuration, failed:
        (search.out_dir / setup.RESUME_POINTER).unlink(missing_ok=True)  # nothing to resume
        remove_if_empty(search.made)
        raise
    except BaseException:  # bad data found before a trial, say: no empty folder left
        remove_if_empty(search.made)
        raise


def _searched(
    search: setup.Checked, progress: Progress, started: float, stolen: tuple[float, float]
) -> SearchResult:
    """:func:`run_search` once its options are checked and its folder is writable;
    ``stolen``, the CPU time stolen from this machine when it started."""
    # Ray is imported only once the input is known good
    from raytune_loader.tuning import searcher, tuner

    opts, out_dir = search.opts, search.out_dir
    job = prepare_data(search.job, max(opts.batch_sizes or (1,)), progress)
    cluster = tuner.start_ray(
        opts.address, opts.dashboard_host, hardware.usable_cpus(), opts.verbose, opts.node_type,
        opts.cpu_node_type,
    )  # fmt: skip
    try:
        plan = setup.plan(replace(search, job=job), cluster, progress)
        # the cache trials read the objects the first one fetched
        with search_cache(True in plan.space.caches and not plan.job.cold) as shared:
            trials = replace(plan.job, shared_cache=shared and str(shared))
            run = tuner.run_tune(trials, plan.space, plan.settings, cluster, progress.trial)
        # the previous search's trials.csv stays beside its best_config.json until
        # this search has a result of its own
        records.write_trials_csv(out_dir / "trials.partial.csv", run.records)
        if run.interrupted:
            finished = sum(record.status != "interrupted" for record in run.records)
            raise SearchInterruptedError(
                f"search interrupted after {finished} finished trials, kept in {out_dir}; "
                "continue it with the same command and --resume"
            )
        verified = verify_classes(plan.job, plan.space, run.records, plan.opts, cluster,
                                  search.gpus_per_trial, progress)  # fmt: skip
    finally:
        tuner.stop_ray()
    context = SearchContext(
        plan.opts, plan.space, plan.job, started, search.gpus_per_trial, plan.max_concurrent,
        cluster.joined, sampler=searcher.describe(opts.seed, opts.search),
        scheduler=tuner.scheduler_description(plan.job), search=run.search, model=plan.model,
        cpu_steal_frac=None if cluster.joined
        else hardware.stolen_share(stolen, hardware.cpu_time_stolen()),
    )  # fmt: skip
    by_class = records.by_hardware_class(run.records)
    best, trials = write_results(out_dir, context, by_class, verified, progress)
    (out_dir / setup.RESUME_POINTER).unlink(missing_ok=True)  # nothing left to resume
    return SearchResult(out_dir, best, trials, cluster.dashboard_url)
