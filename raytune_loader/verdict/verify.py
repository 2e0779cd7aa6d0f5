"""Verification: the best candidates and the baselines re-measured one at a time.

:func:`verification_configs` picks the baselines and the top candidates of the search;
:func:`verify` re-measures them in rotated rounds, so drift hits all alike, beside the
ceiling in every round (one window each), until every candidate is clearly apart from
the best or within its noise. A ceiling is a best case, which anything running beside
it only slows, so the final ceiling is the highest of all its measurements (measured
once more, the best of its full windows, where a run beat it), and every run's
efficiency is taken against it. :func:`with_input_rates` measures the winner's
input pipeline alone, to say whether the input or the model is the limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.engines import engine_of
from raytune_loader.errors import UserInputError, last_line
from raytune_loader.measuring import steady
from raytune_loader.measuring.job import TrialJob
from raytune_loader.measuring.measurer import CEILING_WINDOWS, Measurer
from raytune_loader.measuring.outcomes import InputRate, TrialOutcome
from raytune_loader.measuring.records import MEASURED, TrialRecord, ran_alone
from raytune_loader.progress import Progress
from raytune_loader.tuning.space import SearchSpace
from raytune_loader.verdict.selection import (
    MIN_ROUNDS,
    OUT_OF_REACH,
    Candidate,
    decided,
    fitting,
    out_of_reach,
    rotation,
    select,
)

log = logging.getLogger(__name__)


CEILING = "ceiling"  # the ceiling's place in a verification round


TOP_RAYDATA = "top-raydata"  # the best tuned Ray Data candidate, where no top one is


MeasuredFn = Callable[[int, int, str, int, TrialOutcome], None]


def verification_configs(
    records: Sequence[TrialRecord], space: SearchSpace, top: int, objective: str
) -> dict[str, LoaderConfig]:
    """The baselines, then the ``top`` best distinct configurations of the search
    (trusted trials first: a steady window and a figure within bounds; then finished
    trials before those ASHA stopped); where the space offers Ray Data and none of them
    is a tuned Ray Data candidate, the best one as well (``top-raydata``), so that the
    tuned pipeline is verified beside Ray's documented one and the DataLoaders."""
    named: dict[str, LoaderConfig] = dict(space.baselines())
    baselines = len(named)
    ranked = sorted(
        (r for r in records if r.status in MEASURED and r.objective(objective) and r.config),
        key=lambda r: (r.trusted, r.status == "ok", r.objective(objective) or 0.0),
        reverse=True,
    )
    for record in ranked:
        if len(named) >= baselines + top:
            break
        if record.config not in named.values():
            named[f"top-{len(named) - baselines + 1}"] = record.config  # type: ignore[assignment]
    tuned = list(named.values())[baselines:]
    if space.raydata and top and not any(engine_of(c).remote for c in tuned):
        kept = set(named.values())
        best = next((r.config for r in ranked if r.config and engine_of(r.config).remote
                     and r.config not in kept), None)  # fmt: skip
        if best is not None:
            named[TOP_RAYDATA] = best
    return named


@dataclass(frozen=True)
class Verified:
    """Each configuration's repeated runs, against the final ceiling of each batch size."""

    candidates: list[Candidate]
    ceilings: dict[int, float]
    input_rates: dict[str, InputRate] = field(default_factory=dict)  # by candidate name
    rounds: int = 0  # verification rounds run (fewer than asked when the runs decided)
    probes: list[Candidate] = field(default_factory=list)  # the winner's variants (findings)


def verify(
    job: TrialJob,
    configs: dict[str, LoaderConfig],
    repeats: int,
    measurer: Measurer,
    *,
    slot_base: int = 0,
    on_measured: MeasuredFn | None = None,
    objective: str | None = None,
    searched: Mapping[str, TrialOutcome] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> Verified:
    """Each configuration once a round, one at a time, the order rotated every round,
    with the ceiling re-measured in each round at every batch size that has one; up to
    ``repeats`` rounds, fewer when the runs already decide the winner (with an
    ``objective``: :func:`raytune_loader.verdict.selection.decided`, after ``MIN_ROUNDS``).
    With an ``objective``, a configuration out of reach of the best after a round
    (:func:`raytune_loader.verdict.selection.out_of_reach`) is not measured again; one
    already out of reach by the search's own runs (``searched``: the trials that ran
    alone, :func:`searched_runs`) is not measured at all, its trial its one run. One left
    out comes back when the best's later runs fall within its reach: measured at once,
    and in every round left. After each round, where a run beat the ceiling, the ceiling
    is measured again before the runs are judged (:func:`_bound_again`).
    ``on_start`` hears the runs planned, ``on_measured`` each run as it ends."""
    order = list(configs) + ([CEILING] if job.ceilings else [])
    outcomes: dict[str, list[TrialOutcome]] = {name: [] for name in configs}
    ceilings = dict(job.ceilings)
    # out of reach of the best: measured no more
    searched = searched or {}
    left_out = _out_of_reach_already(configs, searched, ceilings, objective)
    for name in left_out:
        outcomes[name].append(searched[name])
    total = (len(configs) - len(left_out)) * repeats
    done = 0
    if on_start is not None:
        on_start(total)

    def run(name: str, repeat: int) -> None:
        nonlocal done
        done += 1
        # --cold: verification reads samples no trial read either
        outcome = measurer.measure(job, configs[name], slot_base + done)
        outcomes[name].append(outcome)
        if on_measured is not None:
            on_measured(done, total, name, repeat + 1, outcome)

    rechecked: set[int] = set()  # the batch sizes whose ceiling a beaten run measured again

    def current() -> list[Candidate]:
        _bound_again(job, measurer, outcomes, ceilings, rechecked)
        return _candidates(configs, outcomes, ceilings)

    for repeat in range(repeats):
        for name in rotation(order, repeat):
            if name == CEILING:
                _remeasure(job, measurer, ceilings)
            elif name not in left_out:
                run(name, repeat)
        candidates = current()
        if not objective:
            continue
        # the best's later runs may fall back within reach of one left out: measured
        # again at once, and in every round left, so its figures are not its earlier run
        back = left_out - out_of_reach(candidates, objective)
        if back:
            log.info("measured again, back within reach of the best: %s", ", ".join(sorted(back)))
            left_out -= back
            total += len(back) * (repeats - repeat)
            for name in sorted(back):
                run(name, repeat)
            candidates = current()
        if repeat + 1 >= MIN_ROUNDS and decided(candidates, objective):
            if on_measured is not None and done < total:
                log.info("verification decided after %d rounds", repeat + 1)
            break
        far = out_of_reach(candidates, objective) - left_out if repeat + 1 < repeats else set()
        if far:
            log.info("not measured again, %gx or more below the best: %s",
                     OUT_OF_REACH, ", ".join(sorted(far)))  # fmt: skip
            left_out |= far
            total -= len(far) * (repeats - repeat - 1)
    return Verified(_candidates(configs, outcomes, ceilings), ceilings, rounds=repeat + 1)


def searched_runs(
    records: Sequence[TrialRecord], configs: Mapping[str, LoaderConfig]
) -> dict[str, TrialOutcome]:
    """The search's own run of each configuration to verify, where one counts as a
    verification run: its trial finished its window (ASHA did not stop it), was trusted
    (steady, within bounds), and ran alone (:func:`~raytune_loader.measuring.records.ran_alone`),
    measured by the same code, on the same hardware, as verification's runs are."""
    alone = [r for r in ran_alone(list(records)) if r.status == "ok" and r.trusted]
    runs: dict[str, TrialOutcome] = {}
    for name, config in configs.items():
        record = next((r for r in alone if r.config == config), None)
        if record is not None and (outcome := record.outcome()) is not None:
            runs[name] = outcome
    return runs


def _out_of_reach_already(
    configs: Mapping[str, LoaderConfig],
    searched: Mapping[str, TrialOutcome],
    ceilings: dict[int, float],
    objective: str | None,
) -> set[str]:
    """The configurations out of reach of the best by the search's own runs alone: a
    rule-of-thumb baseline 14 times below the tuned loader on a bucket took a third of
    that search's verification to be measured once more."""
    if not objective or not searched:
        return set()
    runs = {name: [searched[name]] for name in configs if name in searched}
    far = out_of_reach(_candidates({n: configs[n] for n in runs}, runs, ceilings), objective)
    if far:
        log.info("not measured, the search's own run %gx or more below its best: %s",
                 OUT_OF_REACH, ", ".join(sorted(far)))  # fmt: skip
    return far


def _candidates(
    configs: dict[str, LoaderConfig],
    outcomes: dict[str, list[TrialOutcome]],
    ceilings: dict[int, float],
) -> list[Candidate]:
    return [
        Candidate(name, configs[name], tuple(_rebased(o, ceilings) for o in outcomes[name]))
        for name in configs
    ]


def _bound_again(
    job: TrialJob,
    measurer: Measurer,
    outcomes: Mapping[str, Sequence[TrialOutcome]],
    ceilings: dict[int, float],
    rechecked: set[int],
) -> None:
    """The ceiling measured once more, the best of its full windows, at each batch size
    (not in ``rechecked``, to which it is added) where a run beat it beyond noise, before
    the rounds judge without such a run: a ceiling measured while something ran beside it
    is low, and a model-bound loader trains at the ceiling (1.02x of it, the tiny search
    of the tests beside two busy processes on two cores), so a ceiling caught by load
    refuses the good runs. One that still beats it is left out."""
    beaten = sorted({
        o.effective_batch_size for runs in outcomes.values() for o in runs
        if o.effective_batch_size in ceilings and _rebased(o, ceilings).beyond_bound
    } - rechecked)  # fmt: skip
    if beaten:
        rechecked.update(beaten)
        log.info("a run beat the ceiling at batch size %s: measured again",
                 ", ".join(map(str, beaten)))  # fmt: skip
        _remeasure(job, measurer, ceilings, beaten, windows=CEILING_WINDOWS)


def _remeasure(
    job: TrialJob,
    measurer: Measurer,
    ceilings: dict[int, float],
    sizes: Sequence[int] | None = None,
    windows: int = 1,
) -> None:
    for batch_size in sorted(job.ceilings) if sizes is None else sizes:
        try:
            effective, speed = measurer.ceiling(job, batch_size, windows=windows)
        except Exception as exc:  # noqa: BLE001 - the earlier ceiling still stands
            log.warning("re-measuring the ceiling at %d failed: %s", batch_size, last_line(exc))
            continue
        ceilings[effective] = max(speed, ceilings.get(effective, 0.0))


def _rebased(outcome: TrialOutcome, ceilings: dict[int, float]) -> TrialOutcome:
    return outcome.rebased(ceilings.get(outcome.effective_batch_size or 0))


def with_input_rates(
    verified: Verified, job: TrialJob, objective: str, measurer: Measurer, progress: Progress
) -> Verified:
    """The input pipeline alone for the configurations that matter (the one chosen and
    the best by the objective, when they differ), to say where the limit is."""
    selection = select(verified.candidates, objective)
    if selection is None:
        return verified
    names = dict.fromkeys([selection.winner.name, selection.best_by_objective.name])
    by_name = {c.name: c for c in verified.candidates}
    what = "measuring the input pipeline alone (no model)"
    rates: dict[str, InputRate] = {}
    for i, name in enumerate(names):
        progress.count(what, i, len(names))
        try:
            rates[name] = _input_rate(by_name[name], job, measurer)
        except UserInputError:
            raise
        except Exception as exc:  # noqa: BLE001 - the result stands without it
            progress.warn(f"cannot measure {name}'s input pipeline alone: {last_line(exc)}")
    progress.count(what, len(names), len(names))
    return replace(verified, input_rates=rates)


INPUT_TRIES = 3  # the input pipeline alone, measured at most this often (see below)


def _input_rate(candidate: Candidate, job: TrialJob, measurer: Measurer) -> InputRate:
    """The candidate's input pipeline alone, measured again while its trained rate beats
    it beyond :data:`~raytune_loader.measuring.steady.BOUND_TOLERANCE`, up to
    :data:`INPUT_TRIES` times, the best kept: a bound measured while something else took
    the cores comes out low (a search beside other work: more than 5% under the winner's
    rate; on a noisy VM twice running), and a real defect beats every measurement."""
    config = fitting(candidate)
    trained = candidate.stats("samples_per_s")
    best = measurer.input_rate(job, config)
    for _ in range(INPUT_TRIES - 1):
        if trained is None or not steady.above_bound(trained.median, best.samples_per_s, ""):
            break
        log.info("%s trained above its input pipeline alone: measuring it again", candidate.name)
        best = max(best, measurer.input_rate(job, config), key=lambda found: found.samples_per_s)
    return best
