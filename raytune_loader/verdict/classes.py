"""After the trials: each hardware class verified on its own node, then probed.

A search whose trials ran on several hardware classes (``measuring.records.by_hardware_class``)
verifies each apart, on the node its best trial ran on, with that node's ceiling: the
baselines and the top candidates re-measured in rounds (:mod:`~raytune_loader.verdict.verify`),
the winner's input pipeline alone, and the probes the findings need
(:mod:`~raytune_loader.verdict.probes`). It measures through the search's Ray tasks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from raytune_loader.measuring import records
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.measurer import measure_ceilings
from raytune_loader.measuring.records import TrialRecord
from raytune_loader.progress import Progress
from raytune_loader.tuning.options import SearchOptions
from raytune_loader.tuning.space import SearchSpace
from raytune_loader.verdict import findings, probes
from raytune_loader.verdict.verify import (
    Verified,
    searched_runs,
    verification_configs,
    verify,
    with_input_rates,
)


def verify_classes(
    job: TrialJob,
    space: SearchSpace,
    trials: list[TrialRecord],
    opts: SearchOptions,
    cluster: Any,
    gpus_per_trial: float,
    progress: Progress,
) -> dict[str, Verified]:
    """Every hardware class of ``trials`` verified and probed.

    Args:
        job: the search's job.
        space: the search's space.
        trials: every trial of the search.
        opts: the search's options (the objective, the verification's top and repeats).
        cluster: the Ray cluster the trials ran on.
        gpus_per_trial: a trial's GPUs.
        progress: where the rounds are counted.

    Returns:
        Each class's verification, the class with the most trials first.
    """
    from raytune_loader.tuning.tuner import live_nodes

    by_class = records.by_hardware_class(trials)
    alive = live_nodes()
    live = _live_classes(by_class, alive, progress)
    return {
        hw_class: verify_class(job, space, class_records, opts, cluster, gpus_per_trial,
                               progress, len(live), alive)
        for hw_class, class_records in live.items()
    }  # fmt: skip


def _live_classes(
    by_class: dict[str, list[TrialRecord]], alive: set[str] | None, progress: Progress
) -> dict[str, list[TrialRecord]]:
    """The classes with a node in the cluster now, where there are several. A search resumed on
    other hardware holds trials whose nodes are gone: verifying there would pin the runs
    to a node that no longer exists, so that class is said and left unverified (its
    trials stay in trials.csv)."""
    if alive is None or len(by_class) < 2:
        return by_class
    live = {c: rs for c, rs in by_class.items() if any(r.node.node_id in alive for r in rs)}
    for hw_class in by_class.keys() - live.keys():
        progress.warn(
            f"{hw_class}: its {len(by_class[hw_class])} trials ran on nodes no longer in the "
            "cluster (a search resumed elsewhere): not verified, kept in trials.csv"
        )
    if not live:  # none of them here: verify on whatever this cluster has
        return by_class
    return live


def verify_class(
    job: TrialJob,
    space: SearchSpace,
    class_records: list[TrialRecord],
    opts: SearchOptions,
    cluster: Any,
    gpus_per_trial: float,
    progress: Progress,
    classes: int,
    alive: set[str] | None = None,
) -> Verified:
    """Re-measure the top configurations and both baselines, interleaved, one at a time,
    with the whole accelerator. With several hardware classes each is verified on the
    node its best trial ran on (of those in the cluster, ``alive``); the baselines and
    reservations then follow that node."""
    from raytune_loader.tuning.tuner import RayMeasurer

    here = [r for r in class_records if alive is None or r.node.node_id in alive]
    node_id = records.best_node(here, opts.objective) if classes > 1 else None
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
    verified = verify(
        job,
        configs,
        opts.verify_repeats,
        measurer,
        on_measured=lambda done, total, *_: progress.count(what, done, total),
        slot_base=opts.num_samples,
        objective=opts.objective,
        # a resumed search's trials may have run beside an attempt its records lost
        searched=None if opts.resume else searched_runs(class_records, configs),
        on_start=lambda total: progress.count(what, 0, total),
    )
    if verified.rounds < opts.verify_repeats:
        # fewer than two measured decide at once (selection.decided): none, when every
        # run failed
        measured = any(c.stats(opts.objective) is not None for c in verified.candidates)
        why = "more runs could not change the winner" if measured else "every run failed"
        progress.stage(f"Verification ended after {verified.rounds} of {opts.verify_repeats} "
                       f"rounds: {why}")  # fmt: skip
    verified = with_input_rates(verified, job, opts.objective, measurer, progress)
    rules = findings.Rules(opts.memory_share, opts.cpus_per_worker)
    return probes.probe(verified, job, opts.objective, class_records, measurer, progress, rules)
