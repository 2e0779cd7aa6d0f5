"""The search's trials as an Optuna study on disk, for optuna-dashboard.

The search's own study lives in its searcher's memory (and in Tune's checkpoint, for
``--resume``); what a person opens after the search is ``study.journal`` beside
``trials.csv``, written from the same trials: one Optuna trial each, with the
parameters the space offered it (a parameter's distribution is what the space offered,
widened to the baselines'), the objective as its value, and the trial's status, figures
and structure as user attributes. A finished trial is COMPLETE, one ASHA stopped is
PRUNED, a failed or interrupted one FAIL, so the dashboard's best trial is
``trials.csv``'s best. A resumed search rewrites the file with every trial, those before
the interruption included.

    optuna-dashboard results/<dataset>/study.journal
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raytune_loader.measuring.records import TrialRecord
from raytune_loader.tuning.space import SearchSpace

STUDY_FILE = "study.journal"
ATTRIBUTES = ("trial_id", "status", "reason", "baseline", "samples_per_s", "util",
              "data_wait_frac", "steady", "bounds", "predicted_samples_per_s")  # fmt: skip


def write_study(
    path: Path, space: SearchSpace, trials: Sequence[TrialRecord], objective: str, name: str
) -> None:
    """``trials`` as the study ``name`` in a journal file at ``path`` (replaced whole)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    placed = [(r, space.as_point(r.config), space.choices_of(r.config))
              for r in trials if r.config is not None]  # fmt: skip
    offered: dict[str, tuple[Any, ...]] = {}
    for _, point, choices in placed:
        for key, shape in choices.items():
            offered[key] = _widened(offered.get(key), shape, point[key])
    distributions = {key: _distribution(shape) for key, shape in offered.items()}
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.unlink(missing_ok=True)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = JournalStorage(JournalFileBackend(str(scratch)))
        study = optuna.create_study(storage=storage, study_name=name, direction="maximize")
        study.set_user_attr("objective", objective)
        study.add_trials([_trial(record, point, distributions, objective)
                          for record, point, _ in placed])  # fmt: skip
    finally:
        optuna.logging.set_verbosity(verbosity)
    os.replace(scratch, path)


def _trial(
    record: TrialRecord, point: dict[str, Any], distributions: dict[str, Any], objective: str
) -> Any:
    import optuna

    row = record.row()
    attrs = {key: row[key] for key in ATTRIBUTES if row.get(key) not in (None, "")}
    attrs["structure"] = record.config.label() if record.config is not None else ""
    value = row.get(objective)
    state = optuna.trial.TrialState.FAIL
    if record.status == "ok" and value not in (None, ""):
        state = optuna.trial.TrialState.COMPLETE
    elif record.status == "stopped_early":
        state = optuna.trial.TrialState.PRUNED
    return optuna.trial.create_trial(
        params=point,
        distributions={key: distributions[key] for key in point},
        value=float(value) if state == optuna.trial.TrialState.COMPLETE else None,
        state=state,
        user_attrs=attrs,
    )


def _widened(known: tuple[Any, ...] | None, shape: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
    """What the space offered a parameter over every trial, and the value a trial took
    (a baseline's may lie outside the space: the rule of thumb on a small node)."""
    if shape[0] == "int":
        lows = [shape[1], value] + ([known[1]] if known else [])
        highs = [shape[2], value] + ([known[2]] if known else [])
        return ("int", min(lows), max(highs))
    choices = list(known[1:]) if known else []
    for choice in (*shape[1:], value):
        if choice not in choices:
            choices.append(choice)
    return ("choice", *choices)


def _distribution(shape: tuple[Any, ...]) -> Any:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if shape[0] == "int":
        return IntDistribution(shape[1], shape[2])
    return CategoricalDistribution(shape[1:])
