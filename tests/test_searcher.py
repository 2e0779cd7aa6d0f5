from __future__ import annotations

import optuna

from raytune_loader.space import SearchSpace
from raytune_loader.tuner import _LoaderSearch


def _searcher(space: SearchSpace, **kwargs) -> _LoaderSearch:
    return _LoaderSearch(
        space=space.define_by_run,
        metric="util",
        mode="max",
        sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=2),
        points_to_evaluate=[space.as_point(c) for c in space.baselines().values()],
        **kwargs,
    )


def test_the_search_does_not_measure_a_configuration_twice() -> None:
    space = SearchSpace(max_workers=1, batch_sizes=(8,), cuda=False, usable_cpus=1)
    searcher = _searcher(space)
    seen = []
    for i in range(9):  # the space holds 1 + 4 x 2 = 9 configurations
        config = searcher.suggest(f"t{i}")
        seen.append(tuple(sorted(config.items())))
        util = 0.3 if config["num_workers"] == 0 else 0.5 + 0.01 * config["prefetch_factor"]
        searcher.on_trial_complete(f"t{i}", {"util": util})
    assert len(set(seen)) == 9
    assert dict(seen[0])["num_workers"] == 0  # pytorch-default first
    assert dict(seen[1]) == {"num_workers": 1, "prefetch_factor": 2, "persistent_workers": True,
                             "batch_size": 8}  # heuristic second  # fmt: skip


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
