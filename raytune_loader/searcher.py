"""The Tune searcher: Optuna's ask-and-tell behind Tune's public ``Searcher`` interface.

Tune asks :meth:`LoaderSearcher.suggest` for a configuration per trial and tells
:meth:`LoaderSearcher.on_trial_complete` its last result. Behind that sits a
plain Optuna study (seeded TPE, the two baselines enqueued first) driven only
through Optuna's public ``ask``/``tell``/``enqueue_trial``, with the define-by-run
space of :class:`~raytune_loader.space.SearchSpace`. On top of a bare TPE it
stops proposing at the time budget (Tune's own budget kills running trials; the
contract is only to stop starting new ones), and does not measure a
configuration twice: the space is small on small machines (17 configurations
on two cores), so TPE often proposes one already measured; its known result is
told to Optuna and another is asked for.
"""

from __future__ import annotations

import contextlib
import pickle
import time
import warnings
from collections.abc import Iterator
from typing import Any

import optuna
from ray.tune.search import Searcher

from raytune_loader.job import DATA_SLOT
from raytune_loader.space import SearchSpace

N_STARTUP_TRIALS = 4  # random trials before TPE models the space
MAX_RETRIES = 20  # proposals of already-measured configurations before one is re-run

Key = tuple[tuple[str, Any], ...]


def describe(seed: int) -> str:
    """The sampler as ``best_config.json`` records it."""
    return f"optuna TPESampler(seed={seed}, n_startup_trials={N_STARTUP_TRIALS})"


@contextlib.contextmanager
def _baselines_outside_the_bounds() -> Iterator[None]:
    """With several ranks the rule of thumb has more workers per rank than the space's
    bound; enqueued, Optuna measures it as it is, and warns twice: not news to us."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".* out of (the )?range", UserWarning)
        yield


class LoaderSearcher(Searcher):
    def __init__(
        self,
        space: SearchSpace,
        metric: str,
        seed: int = 0,
        *,
        deadline: float | None = None,
        cold: bool = False,
        n_startup_trials: int = N_STARTUP_TRIALS,
        enqueue_baselines: bool = True,
    ) -> None:
        super().__init__(metric=metric, mode="max")
        self._space = space
        self._deadline = deadline
        self._cold = cold
        self._slots = 0
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials)
        self._study = optuna.create_study(direction="maximize", sampler=sampler)
        if enqueue_baselines:
            with _baselines_outside_the_bounds():
                for config in space.baselines().values():
                    self._study.enqueue_trial(space.as_point(config))
        self._measured: dict[Key, float] = {}
        self._asked: dict[str, tuple[optuna.trial.Trial, Key]] = {}

    def _ask(self) -> tuple[optuna.trial.Trial, dict[str, Any], Key]:
        trial = self._study.ask()
        with _baselines_outside_the_bounds():
            constants = self._space.define_by_run(trial) or {}  # suggests the parameters
        config = {**trial.params, **constants}
        return trial, config, tuple(sorted(config.items()))

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._deadline is not None and time.time() > self._deadline:
            return Searcher.FINISHED
        trial, config, key = self._ask()
        for _ in range(MAX_RETRIES):
            if key not in self._measured:
                break
            self._study.tell(trial, self._measured[key])  # TPE learns from the known value
            trial, config, key = self._ask()
        self._asked[trial_id] = (trial, key)
        if self._cold:
            config[DATA_SLOT] = self._slots  # a subset no earlier trial read
            self._slots += 1
        return config

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        asked = self._asked.pop(trial_id, None)
        if asked is None:
            return
        trial, key = asked
        if error or not result or result.get(self.metric) is None:
            self._study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return
        value = float(result[self.metric])
        self._measured[key] = value
        self._study.tell(trial, value)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as handle:
            pickle.dump(self.__dict__, handle)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as handle:
            self.__dict__.update(pickle.load(handle))
        # a resumed search does not know how long the interruption lasted: the rest of
        # the asked trials run whatever the original budget
        self._deadline = None
