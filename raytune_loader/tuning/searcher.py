"""The Tune searcher: Optuna's ask-and-tell behind Tune's public ``Searcher`` interface.

Tune asks :meth:`LoaderSearcher.suggest` for a configuration per trial and tells
:meth:`LoaderSearcher.on_trial_complete` its last result. Behind that sits a
plain Optuna study (seeded, the baselines enqueued first) driven only through
Optuna's public ``ask``/``tell``/``enqueue_trial``, with the define-by-run space of
:class:`~raytune_loader.tuning.space.SearchSpace`. Three methods (``--search``):

- ``model`` (the default): a cost model (:mod:`raytune_loader.tuning.costmodel`) predicts
  every candidate from the profile. After the baselines, the first trials are the
  predicted best of each structure (decoder x transfer x worker kind) the model
  does not rule out, then TPE proposes around them; a proposal the model puts
  below its best by more than its measured error is not run (its prediction is
  told to TPE instead) and counted. Each finished trial calibrates the model: what
  the trials bound by the same part (the step, the workers, the cores, the store, the
  actors) measured over what the profile alone predicted for them, their median, is
  the model's bias in that part on this node (the cores all busy at once, where the
  profile timed each stage alone; a store's server beside the trials); that part's
  time in the next predictions is divided by it, and the slowest part, calibrated,
  sets the pace. The error, and the margin, are then what the calibrated model gets
  wrong, each trial's prediction calibrated by the others (leave one out).
- ``tpe``: TPE alone, after the baselines.
- ``random``: random proposals, after the baselines.

It stops proposing at the time budget (Tune's own budget kills running trials; the
contract is only to stop starting new ones), and does not measure a
configuration twice: its known result is told to Optuna and another is asked for.
"""

from __future__ import annotations

import contextlib
import functools
import math
import pickle
import statistics
import time
import warnings
from collections.abc import Iterator
from typing import Any

import optuna
from ray.tune.search import Searcher

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.candidates.structure import structure
from raytune_loader.measuring.job import DATA_SLOT
from raytune_loader.measuring.records import PREDICTED
from raytune_loader.tuning.costmodel import CostModel, Prediction, median_error
from raytune_loader.tuning.space import SearchSpace

N_STARTUP_TRIALS = 4  # random trials before TPE models the space
MAX_RETRIES = 20  # proposals of already-measured configurations before one is re-run
FIRST_MARGIN = 0.25  # the model's margin before any trial measured its error
MIN_MARGIN = 0.05  # never closer than this: the runs' own noise

Key = tuple[tuple[str, Any], ...]


def describe(seed: int, method: str = "model") -> str:
    """The sampler as ``best_config.json`` records it."""
    if method == "random":
        return f"optuna RandomSampler(seed={seed})"
    tpe = f"optuna TPESampler(seed={seed}, n_startup_trials={N_STARTUP_TRIALS})"
    return f"cost model, then {tpe}" if method == "model" else tpe


@contextlib.contextmanager
def _baselines_outside_the_bounds() -> Iterator[None]:
    """With several ranks the rule of thumb has more workers per rank than the space's
    bound; enqueued, Optuna measures it as it is, and warns twice: not news to us."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".* out of (the )?range", UserWarning)
        yield


class LoaderSearcher(Searcher):
    """Tune's searcher: Optuna proposes, the space keeps every proposal valid, the cost model
    (``--search model``) goes first and skips what it rules out."""

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
        method: str = "tpe",
        model: CostModel | None = None,
    ) -> None:
        super().__init__(metric=metric, mode="max")
        self._space = space
        self._deadline = deadline
        self._cold = cold
        self._slots = 0
        self._model = model if method == "model" else None
        self._method = method
        sampler: optuna.samplers.BaseSampler = (
            optuna.samplers.RandomSampler(seed=seed)
            if method == "random"
            else optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials)
        )
        self._study = optuna.create_study(direction="maximize", sampler=sampler)
        # (the profile's prediction, measured samples/s, its bound's key, the Prediction);
        # a searcher saved by an earlier release kept the first two or three
        self._pairs: list[tuple[Any, ...]] = []
        # by what the model reads of a configuration (see _current for older searchers)
        self._forecasts: dict[tuple[Any, ...], Prediction | None] = {}
        first = list(space.baselines().values()) if enqueue_baselines else []
        if self._model is not None:
            first += self._structure_bests(first)
        self._first = len(first)
        with _baselines_outside_the_bounds():
            for config in first:
                self._study.enqueue_trial(space.as_point(config))
        self._measured: dict[Key, float] = {}
        self._asked: dict[str, tuple[optuna.trial.Trial, Key, float | None]] = {}
        self.skipped = 0

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled whole (Tune's ``tuner.pkl`` on ``--resume``), as this release keeps it."""
        self.__dict__.update(_current(state))

    # -- the cost model's part ------------------------------------------------------

    def _forecast(self, config: LoaderConfig) -> Prediction | None:
        """The model's prediction for ``config`` (None without a model or a prediction);
        remembered by what the model reads of it, as the space has many alike."""
        if self._model is None:
            return None
        key = _read_by_the_model(config)
        if key not in self._forecasts:
            self._forecasts[key] = self._model.predict(config)
        return self._forecasts[key]

    def _predicted(self, config: LoaderConfig) -> float | None:
        """The model's samples/s for ``config``, each part calibrated by the trials so far
        (None without a model or a prediction)."""
        found = self._forecast(config)
        if found is None:
            return None
        return found.calibrated(functools.partial(calibration, self._pairs))[0]

    def _kept_up(self, config: LoaderConfig) -> bool:
        """Its requests in flight keep up with its pace with the model's margin to spare:
        their wait a batch is at most (1 - margin) of the pace's. One that only just
        keeps up falls to the store's pace at a GET a little slower than the profile's."""
        found = self._forecast(config)
        return found is None or found.waiting <= 1 - self.margin

    def _objective(self, config: LoaderConfig, samples_per_s: float) -> float:
        """The objective a prediction stands for: util is samples/s over the ceiling."""
        if self.metric != "util" or self._model is None:
            return samples_per_s
        return samples_per_s / (self._model.ceilings.get(config.batch_size) or 1.0)

    @property
    def margin(self) -> float:
        """How far below its best the model must put a candidate to skip it: its median
        error on the trials so far (FIRST_MARGIN before any)."""
        error = calibrated_error(self._pairs)
        return FIRST_MARGIN if error is None else max(MIN_MARGIN, error)

    @property
    def _best(self) -> float:
        """The model's best predicted objective over the space, as calibrated now
        (worked out again after each finished trial)."""
        # (a searcher saved before the calibration kept it as a float: not read)
        cached = self.__dict__.get("_best_at")
        if cached is None or cached[0] != len(self._pairs):
            scored = [self._objective(c, p) for c in self._distinct()
                      if (p := self._predicted(c)) is not None]  # fmt: skip
            self._best_at = cached = (len(self._pairs), max(scored, default=0.0))
        return float(cached[1])

    def _distinct(self) -> list[LoaderConfig]:
        """One configuration of the space for each the model tells apart (the grid
        walked once)."""
        if "_representatives" not in self.__dict__:
            found = {_read_by_the_model(c): c for c in self._space.grid()}  # batch included
            self._representatives = list(found.values())
        return self._representatives

    def _ruled_out(self, config: LoaderConfig, predicted: float | None) -> bool:
        if predicted is None:
            return False
        return self._objective(config, predicted) < self._best * (1 - self.margin)

    def _structure_bests(self, already: list[LoaderConfig]) -> list[LoaderConfig]:
        """Each structure's predicted best (of those the model cannot tell apart, one
        whose requests in flight keep up with a margin: :meth:`_kept_up`), best first,
        leaving out the structures the model rules out and configurations already
        enqueued; where Ray Data is offered,
        its predicted best first in any case (its object store's cost was measured
        elsewhere: its trial measures the model's error on it early)."""
        bests, raydata = [], []
        for kind, configs in self._space.structures().items():
            scored = [(self._objective(c, p), self._kept_up(c), _preference(c), c)
                      for c in configs if (p := self._predicted(c)) is not None]  # fmt: skip
            if not scored:
                continue
            value, _, _, config = max(scored, key=lambda item: item[:3])
            if config in already:
                continue
            if kind.remote:  # Ray Data's best is tried whether or not it is ruled out
                raydata.append((value, config))
            if not self._ruled_out(config, self._predicted(config)):
                bests.append((value, config))
        first = [max(raydata, key=lambda item: item[0])[1]] if raydata else []
        rest = [config for _, config in sorted(bests, key=lambda item: -item[0])]
        return first + [config for config in rest if config not in first]

    # -- Tune's interface -----------------------------------------------------------

    def _ask(self) -> tuple[optuna.trial.Trial, dict[str, Any], Key]:
        trial = self._study.ask()
        with _baselines_outside_the_bounds():
            constants = self._space.define_by_run(trial) or {}  # suggests the parameters
        config = {**trial.params, **constants}
        return trial, config, tuple(sorted(config.items()))

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """The next trial's configuration (Tune asks), or None when the search has proposed all
        it will."""
        if self._deadline is not None and time.time() > self._deadline:
            return Searcher.FINISHED
        trial, config, key = self._ask()
        predicted = self._predicted(LoaderConfig.from_trial_config(config))
        for _ in range(MAX_RETRIES):
            if key in self._measured:
                self._study.tell(trial, self._measured[key])  # TPE learns from the known value
            elif trial.number >= self._enqueued and self._ruled_out(
                LoaderConfig.from_trial_config(config), predicted
            ):
                self.skipped += 1  # not run: TPE learns the prediction instead
                self._study.tell(trial, self._objective(
                    LoaderConfig.from_trial_config(config), predicted or 0.0))  # fmt: skip
            else:
                break
            trial, config, key = self._ask()
            predicted = self._predicted(LoaderConfig.from_trial_config(config))
        self._asked[trial_id] = (trial, key, predicted)
        if predicted is not None:
            config[PREDICTED] = predicted
        if self._cold:
            config[DATA_SLOT] = self._slots  # a subset no earlier trial read
            self._slots += 1
        return config

    @property
    def _enqueued(self) -> int:
        """Trials Optuna was given before asking (the baselines and structures' bests)."""
        return self._first

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        """A trial ended: its objective told to Optuna, its measured rate to the model's error."""
        asked = self._asked.pop(trial_id, None)
        if asked is None:
            return
        # (a searcher saved by a development version kept the profile's prediction fourth)
        trial, key, predicted, *_ = asked
        if error or not result or result.get(self.metric) is None:
            self._study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return
        value = float(result[self.metric])
        self._measured[key] = value
        self._study.tell(trial, value)
        measured = result.get("samples_per_s")
        if predicted and measured and result.get("final", True) and not result.get("failure"):
            found = self._forecast(LoaderConfig.from_trial_config(dict(key)))
            if found is not None and found.samples_per_s > 0 and math.isfinite(measured):
                pair = (found.samples_per_s, float(measured), found.key(found.bound), found)
                self._pairs.append(pair)

    def summary(self) -> dict[str, Any]:
        """How the search proposed, for best_config.json and the report."""
        out: dict[str, Any] = {"method": self._method}
        bounds = sorted({rest[0] for _, _, *rest in self._pairs if rest})
        if self._model is not None:
            out.update(
                skipped=self.skipped,
                skip_rule="a proposal the cost model puts below its best by more than its "
                "median error on the trials so far is not run",
                margin=self.margin,
                model_median_error=calibrated_error(self._pairs),
                uncalibrated_median_error=median_error([(p, m) for p, m, *_ in self._pairs]),
                calibration={bound: calibration(self._pairs, bound) for bound in bounds},
                predictions=len(self._pairs),
            )
        return out

    def save(self, checkpoint_path: str) -> None:
        """Pickle the searcher at ``checkpoint_path`` (Tune calls it; ``--resume`` restores
        it)."""
        with open(checkpoint_path, "wb") as handle:
            pickle.dump(self.__dict__, handle)

    def restore(self, checkpoint_path: str) -> None:
        """The searcher :meth:`save` pickled."""
        with open(checkpoint_path, "rb") as handle:
            self.__dict__.update(_current(pickle.load(handle)))
        # a resumed search does not know how long the interruption lasted: the rest of
        # the asked trials run whatever the original budget
        self._deadline = None


def _current(state: dict[str, Any]) -> dict[str, Any]:
    """A pickled searcher's state as this release keeps it: one that 0.1 pickled kept its
    predictions as floats under ``_predictions``; they are predicted again."""
    state = {k: v for k, v in state.items() if k not in ("_predictions", "_best", "_best_at")}
    state.setdefault("_forecasts", {})
    return state


def calibration(pairs: list[tuple[Any, ...]], bound: str) -> float:
    """What the finished trials measured over the profile's prediction for them, their
    median: of those bound by ``bound`` (the model's part that set their pace), or of
    all where none was, or 1 before any. ``pairs``: (predicted, measured[, bound[,
    the Prediction]]); a searcher saved by an earlier release kept the first two or three."""
    alike = [m / p for p, m, *b in pairs if b[:1] == [bound]]
    ratios = alike or [m / p for p, m, *_ in pairs]
    return statistics.median(ratios) if ratios else 1.0


def calibrated_error(pairs: list[tuple[Any, ...]]) -> float | None:
    """The calibrated model's median error: each trial's prediction calibrated by the
    other trials alone (leave one out), part by part as the search calibrates it
    (:meth:`Prediction.calibrated`; by its bound's factor alone where the pair kept no
    Prediction), against its measurement."""
    calibrated = []
    for i, (p, m, *b) in enumerate(pairs):
        others = pairs[:i] + pairs[i + 1 :]
        if len(b) > 1:
            factor = functools.partial(calibration, others)
            calibrated.append((b[1].calibrated(factor)[0], m))
        else:
            calibrated.append((p * calibration(others, b[0] if b else ""), m))
    return median_error(calibrated)


def _read_by_the_model(config: LoaderConfig) -> tuple[Any, ...]:
    """What the cost model reads of ``config``: the space has many alike."""
    return (structure(config), config.num_workers, config.batch_size, config.pool_size,
            config.actor_cpus_each, config.fetch_threads, config.cache)  # fmt: skip


def _preference(config: LoaderConfig) -> tuple[Any, ...]:
    """Among configurations the model cannot tell apart (prefetch, persistence, order,
    start method, a Ray Data pool's bounds, map calls, budgets and blocks do not change
    its pace), the usual choice first (for Ray Data: a fixed pool, map calls of one
    training batch, two batches prefetched, Ray's budget and blocks)."""
    return (
        config.prefetch_factor == 2,
        config.persistent_workers,
        config.in_order,
        config.multiprocessing_context is None,
        -config.num_workers,
        # as many requests in flight as the pace needs, no more; a cache's warm pace needs
        # none, and its first, cold epoch is paced by them: the most
        config.fetch_threads if config.cache else -config.fetch_threads,
        config.min_actors is None,
        config.map_batch_size == config.batch_size,
        config.prefetch_batches == 2,
        config.object_store_bytes is None and config.block_bytes is None,
        -config.pool_size,
    )
