"""The Tune searcher over Optuna's public ask-and-tell API."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.tuning.searcher import LoaderSearcher
from raytune_loader.tuning.space import SearchSpace


def _searcher(space: SearchSpace, **kwargs) -> LoaderSearcher:
    return LoaderSearcher(space, "util", seed=0, n_startup_trials=2, **kwargs)


def _util(config: dict) -> float:
    """A made-up objective that every parameter moves a little."""
    if config["num_workers"] == 0:
        return 0.3
    rest = 0.002 * config["persistent_workers"] + 0.001 * (config.get("worker_threads") or 0)
    return 0.5 + 0.01 * config["prefetch_factor"] + rest


def test_the_search_does_not_measure_a_configuration_twice() -> None:
    space = SearchSpace(max_workers=1, batch_sizes=(8,), cuda=False, usable_cpus=1)
    searcher = _searcher(space)
    seen = []
    # the space holds 1 + 4 prefetch x 2 persistent x 2 worker_threads = 17 configurations;
    # past about half of them, 20 proposals in a row may all be known ones (MAX_RETRIES)
    for i in range(9):
        config = searcher.suggest(f"t{i}")
        seen.append(tuple(sorted(config.items(), key=str)))
        searcher.on_trial_complete(f"t{i}", {"util": _util(config)})
    assert len(set(seen)) == 9
    assert dict(seen[0])["num_workers"] == 0  # pytorch-default first, the heuristic second
    assert dict(seen[1]) == {"num_workers": 1, "prefetch_factor": 2, "persistent_workers": True,
                             "worker_threads": None, "batch_size": 8}  # fmt: skip


def test_the_search_stops_proposing_after_the_deadline() -> None:
    space = SearchSpace(max_workers=2, batch_sizes=(8,), cuda=False, usable_cpus=2)
    searcher = _searcher(space, deadline=0.0)
    assert searcher.suggest("late") == "FINISHED"


def test_cold_searches_give_every_trial_its_own_data_slot() -> None:
    space = SearchSpace(max_workers=2, batch_sizes=(8,), cuda=False, usable_cpus=2)
    warm, cold = _searcher(space), _searcher(space, cold=True)
    assert "data_slot" not in warm.suggest("w0")
    slots = []
    for i in range(4):
        slots.append(cold.suggest(f"c{i}")["data_slot"])
        cold.on_trial_complete(f"c{i}", {"util": 0.1 * i})
    assert slots == [0, 1, 2, 3]


def test_saved_and_restored_it_goes_on_where_it_stopped(tmp_path: Path) -> None:
    """Tune saves the searcher with the experiment; --resume restores it."""
    space = SearchSpace(max_workers=2, batch_sizes=(8, 16), cuda=False, usable_cpus=2)
    first = _searcher(space)
    for i in range(4):
        config = first.suggest(f"t{i}")
        first.on_trial_complete(f"t{i}", {"util": _util(config)})
    first.save(str(tmp_path / "searcher.pkl"))
    restored = _searcher(space, deadline=0.0)
    restored.restore(str(tmp_path / "searcher.pkl"))
    # the same next proposal, and the deadline of the interrupted run no longer applies
    assert restored.suggest("t4") == first.suggest("t4")


def test_a_failed_trial_is_told_as_failed_not_as_a_value() -> None:
    space = SearchSpace(max_workers=1, batch_sizes=(8,), cuda=False, usable_cpus=1)
    searcher = _searcher(space)
    searcher.suggest("t0")
    searcher.on_trial_complete("t0", None, error=True)
    trial = searcher._study.trials[0]  # noqa: SLF001 - our own study
    assert trial.state.name == "FAIL"


def _model_searcher(per_core: float, method: str = "model") -> LoaderSearcher:
    from raytune_loader.measuring.profile import Profile
    from raytune_loader.tuning.costmodel import CostModel

    space = SearchSpace(max_workers=4, batch_sizes=(32,), cuda=False, usable_cpus=4)
    profile = Profile(32, 4, per_core={"pil/float32": per_core},
                      receive_s={"process/float32": 0.004})  # fmt: skip
    model = CostModel(profile, {32: 400.0})
    return LoaderSearcher(space, "samples_per_s", seed=0, method=method, model=model)


@pytest.mark.parametrize(("per_core", "answer"), [(100.0, 4), (1e6, 0)],
                         ids=["costly-decode", "free-data"])  # fmt: skip
def test_the_model_s_first_proposals_contain_the_answer(per_core: float, answer: int) -> None:
    """A costly decode wants every worker the cores can run; free data wants none."""
    searcher = _model_searcher(per_core)
    enqueued = searcher._first  # noqa: SLF001 - the baselines and the model's first picks
    first = [searcher.suggest(f"t{i}") for i in range(enqueued)]
    ranked = max(first, key=lambda c: c["predicted_samples_per_s"])
    assert ranked["num_workers"] == answer  # the one the model puts first is the answer


def test_proposals_the_model_rules_out_are_not_run_but_counted() -> None:
    searcher = _model_searcher(100.0)
    proposed = []
    for i in range(8):
        config = searcher.suggest(f"t{i}")
        proposed.append(config)
        measured = _forecast(searcher, config).samples_per_s * 0.95  # the profile 5% off
        searcher.on_trial_complete(f"t{i}", {"samples_per_s": measured, "final": True})
    assert searcher.skipped > 0  # 0 or 1 worker: predicted far below 4
    assert all(c["num_workers"] >= 3 for c in proposed[3:])
    summary = searcher.summary()
    assert summary["skipped"] == searcher.skipped
    assert summary["uncalibrated_median_error"] == pytest.approx(0.05 / 0.95, rel=0.01)
    print(
        "XX", summary["uncalibrated_median_error"], summary["model_median_error"], searcher.margin
    )
    assert summary["model_median_error"] == pytest.approx(0.0, abs=1e-9)  # calibrated out


@pytest.mark.parametrize("method", ["tpe", "random"])
def test_the_other_methods_ignore_the_model(method: str) -> None:
    searcher = _model_searcher(100.0, method)
    configs = [searcher.suggest(f"t{i}") for i in range(5)]
    assert all("predicted_samples_per_s" not in c for c in configs) and searcher.skipped == 0
    assert searcher.summary() == {"method": method}


def test_where_ray_data_is_offered_its_predicted_best_runs_first_even_when_ruled_out() -> None:
    """On one machine the model puts a single local actor far below the DataLoaders: the
    rule would skip it, but one tuned Ray Data trial measures the model's error on it,
    first after the baselines."""
    from raytune_loader.measuring.profile import Profile
    from raytune_loader.tuning.costmodel import CostModel

    space = SearchSpace(max_workers=4, batch_sizes=(32,), cuda=False, usable_cpus=4,
                        raydata_cpus=1.0)  # fmt: skip
    profile = Profile(32, 4, per_core={"pil/float32": 100.0},
                      receive_s={"process/float32": 0.004})  # fmt: skip
    model = CostModel(profile, {32: 400.0}, remote_actors=False)
    searcher = LoaderSearcher(space, "samples_per_s", seed=0, method="model", model=model)
    baselines = len(space.baselines())
    first = [searcher.suggest(f"t{i}") for i in range(baselines + 1)]
    assert [c.get("engine") for c in first[:baselines]].count("raydata") == 1  # Ray's docs
    tuned = LoaderConfig.from_trial_config(first[baselines])
    assert tuned.engine == "raydata" and tuned != space.ray_docs_default
    best = max(first, key=lambda c: c["predicted_samples_per_s"])
    assert best["predicted_samples_per_s"] > 2 * first[baselines]["predicted_samples_per_s"]


def test_of_read_aheads_the_model_cannot_tell_apart_it_proposes_one_that_keeps_up() -> None:
    """Shards of 64 samples, a GET 380 ms, two workers on two cores: two shards ahead and
    four are both held to 640 samples/s by the cores, but two keep up only just (their
    wait 95% of the pace's), so a GET a little slower than the profile's would set the
    pace. The structure's first proposal is four ahead; the fewest that keep up with the
    model's margin, not the fewest that tie."""
    from raytune_loader.measuring.profile import Profile
    from raytune_loader.tuning.costmodel import CostModel

    space = SearchSpace(max_workers=2, batch_sizes=(32,), cuda=False, usable_cpus=2,
                        accesses=("stream",), fetch_threads=(1, 2, 4))  # fmt: skip
    side = "pil/float32/stream/loader"
    profile = Profile(32, 2, per_core={side: 500.0}, receive_s={"process/float32": 0.004},
                      fetch_s=0.38, requests_per_sample=1 / 64)  # fmt: skip
    model = CostModel(profile, {32: 1000.0})
    two, four = (LoaderConfig.from_dict({"num_workers": 2, "fetch_threads": f, "access": "stream"},
                                        batch_size=32) for f in (2, 4))  # fmt: skip
    assert model.predict(two).samples_per_s == pytest.approx(640.0)  # type: ignore[union-attr]
    assert model.predict(four).samples_per_s == pytest.approx(640.0)  # type: ignore[union-attr]
    assert model.predict(two).waiting == pytest.approx(0.95)  # type: ignore[union-attr]
    assert model.predict(four).waiting == pytest.approx(0.475)  # type: ignore[union-attr]
    searcher = LoaderSearcher(space, "samples_per_s", seed=0, method="model", model=model)
    first = [
        LoaderConfig.from_trial_config(searcher.suggest(f"t{i}")) for i in range(searcher._first)
    ]  # noqa: SLF001 - the enqueued proposals
    tuned = first[len(space.baselines()) :]
    assert [(c.num_workers, c.fetch_threads) for c in tuned] == [(2, 4)]


def _forecast(searcher: LoaderSearcher, values: dict) -> Any:
    return searcher._forecast(LoaderConfig.from_trial_config(values))  # noqa: SLF001


def test_each_part_of_the_model_is_calibrated_by_the_trials_it_bounded() -> None:
    """The trials measure 80% of what the profile predicts where the cores set the pace,
    90% where the workers do, all of it where the step does (with no workers too): each
    part's time is scaled by its own trials' factor (by all the trials' before its
    first), the slowest then sets the pace, and what the search tells TPE of a proposal
    it skips is calibrated alike. The error, and the margin, are then the calibrated
    model's, not the bias."""
    factor = {"step/inline": 1.0, "step": 1.0, "cores": 0.8, "workers": 0.9}
    searcher = _model_searcher(100.0)
    seen: list[str] = []

    def rule(key: str) -> float:  # a part's own trials, or all trials, or none
        mine = [factor[k] for k in seen if k == key]
        return statistics.median(mine or [factor[k] for k in seen] or [1.0])

    for i in range(8):
        config = searcher.suggest(f"t{i}")
        found = _forecast(searcher, config)
        assert config["predicted_samples_per_s"] == pytest.approx(found.calibrated(rule)[0])
        seen.append(found.key(found.bound))
        measured = found.samples_per_s * factor[found.key(found.bound)]
        searcher.on_trial_complete(f"t{i}", {"samples_per_s": measured, "final": True})
    assert {"step/inline", "cores", "workers"} <= set(seen)  # three parts bounded trials
    summary = searcher.summary()
    assert summary["calibration"] == pytest.approx({k: factor[k] for k in set(seen)})
    assert summary["uncalibrated_median_error"] > 0.1  # most trials are 10% off
    # the error is the search's predictions': where a part close behind its bound becomes
    # the bound at its factor, the prediction is that part's, though the trial here ran
    # at the profile's bound's factor; the bias alone said 11%
    error = summary["model_median_error"]
    assert 0 < error < summary["uncalibrated_median_error"] / 1.5
    assert searcher.margin == pytest.approx(max(0.05, error))
    assert searcher.skipped > 0
    measured = {dict(key)["num_workers"] for key in searcher._measured}  # noqa: SLF001
    told = [t for t in searcher._study.trials[3:]  # noqa: SLF001 - every part measured by then
            if t.params.get("num_workers") not in measured]  # fmt: skip
    assert told  # proposals skipped: their prediction told, calibrated
    for trial in told:
        found = _forecast(searcher, {**trial.params, "batch_size": 32})
        assert trial.value == pytest.approx(found.calibrated(rule)[0])


def test_the_error_is_taken_against_the_other_trials_calibration_alone() -> None:
    """Two trials measured 0.8 of the profile and one 0.4: calibrated by all three
    (0.8), two are exact and the median error would be 0; each calibrated by the other
    two alone, the two are 25% off (0.6) and the third 100% (0.8 for 0.4)."""
    from raytune_loader.tuning.searcher import calibrated_error

    pairs = [(100.0, 80.0, "cores"), (100.0, 80.0, "cores"), (100.0, 40.0, "cores")]
    assert calibrated_error(pairs) == pytest.approx(0.25)


def test_the_error_is_of_the_predictions_the_search_makes_part_by_part() -> None:
    """Two trials bound by the step measured what the profile said (factor 1), two
    bound by the cores measured half (0.5). A step-bound prediction whose cores part was
    0.9 of its step's is, calibrated part by part as the search does, cores-bound at
    1/1.8 of the profile's rate: 44% off its measurement, where scaling by its bound's
    factor alone would call it exact. The median over the four is 22%."""
    from raytune_loader.tuning.costmodel import Prediction
    from raytune_loader.tuning.searcher import calibrated_error

    step = Prediction(100.0, "step", 1.0, parts=(("step", 1.0), ("cores", 0.9)), samples=100.0)
    cores = Prediction(100.0, "cores", 1.0, parts=(("step", 0.5), ("cores", 1.0)), samples=100.0)
    pairs = [(100.0, 100.0, "step", step), (100.0, 100.0, "step", step),
             (100.0, 50.0, "cores", cores), (100.0, 50.0, "cores", cores)]  # fmt: skip
    assert calibrated_error(pairs) == pytest.approx((1 - 1 / 1.8) / 2)
    assert calibrated_error([p[:3] for p in pairs]) == pytest.approx(0.0)  # by bound alone


def test_the_best_it_skips_against_is_calibrated_as_the_trials_come_in() -> None:
    """Every trial measures half of the profile's prediction: the best the skip rule
    holds a proposal against halves with them."""
    searcher = _model_searcher(100.0)
    before = searcher._best  # noqa: SLF001
    for i in range(3):
        config = searcher.suggest(f"t{i}")
        raw = _forecast(searcher, config).samples_per_s
        searcher.on_trial_complete(f"t{i}", {"samples_per_s": 0.5 * raw, "final": True})
    assert searcher._best == pytest.approx(0.5 * before)  # noqa: SLF001


def test_a_searcher_saved_before_the_calibration_calibrates_from_its_own_trials(
    tmp_path: Path,
) -> None:
    """A search folder saved before the calibration: its pairs have no bound, its best
    is a float, its asked trials hold their prediction alone. Resumed, its own trials
    calibrate the next prediction, and the trial it had asked completes."""
    import pickle

    searcher = _model_searcher(100.0)
    config = searcher.suggest("t0")
    raw = _forecast(searcher, config).samples_per_s
    state = {k: v for k, v in searcher.__dict__.items() if k != "_best_at"}
    state.update(_pairs=[(raw, 0.5 * raw)], _best=123.0)
    state["_asked"] = {k: (*v, raw) for k, v in state["_asked"].items()}  # a development
    # version kept the profile's prediction fourth
    saved = tmp_path / "searcher.pkl"
    saved.write_bytes(pickle.dumps(state))
    resumed = _model_searcher(100.0)
    resumed.restore(str(saved))
    assert resumed.summary()["uncalibrated_median_error"] == pytest.approx(1.0)
    resumed.on_trial_complete("t0", {"samples_per_s": 0.5 * raw, "final": True})
    after = resumed.suggest("t1")
    found = _forecast(resumed, after)
    assert after["predicted_samples_per_s"] == pytest.approx(0.5 * found.samples_per_s)
    assert resumed.summary()["predictions"] == 2
