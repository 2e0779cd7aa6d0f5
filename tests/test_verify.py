"""Verification: rotated rounds, the ceiling re-measured beside them, one final ceiling."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.errors import SearchFailedError
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.measurer import LocalMeasurer, measure_ceilings
from raytune_loader.measuring.outcomes import InputRate, TrialOutcome
from raytune_loader.sources.datasets import DatasetSpec
from raytune_loader.tuning.space import SearchSpace
from raytune_loader.verdict.verify import verification_configs, verify, with_input_rates
from records_for_tests import record

JOB = TrialJob(
    dataset=DatasetSpec("datasets_for_tests:fast"),
    model="small-cnn",
    segment=SegmentSpec(warmup_steps=1, steps=4, report_every=4),
    samples_per_trial=64,
    node_cpus=2,
)


class ScriptedCeilings(LocalMeasurer):
    """Real measurements in this process; the ceiling's readings come from a script, and
    every call is logged, so the order and the arithmetic can be checked exactly."""

    def __init__(self, ceilings: list[float]) -> None:
        self.ceilings = ceilings
        self.calls: list[str] = []

    def measure(self, job: TrialJob, config: LoaderConfig, slot: int = 0) -> TrialOutcome:
        self.calls.append(f"w{config.num_workers}@{slot}")
        return super().measure(job, config, slot)

    def ceiling(self, job: TrialJob, batch_size: int, windows: int = 3) -> tuple[int, float]:
        self.calls.append(f"ceiling x{windows}")
        return batch_size, self.ceilings.pop(0)


class _Quiet:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def count(self, what: str, done: int, total: int) -> None:
        pass

    def warn(self, text: str) -> None:
        self.warnings.append(text)


def test_rounds_rotate_with_the_ceiling_and_every_run_uses_the_highest_ceiling() -> None:
    configs = {"a": LoaderConfig(8), "b": LoaderConfig(8, 1, 2, False, True)}
    measurer = ScriptedCeilings([5000.0, 9000.0])
    seen: list[tuple[int, int, str, int]] = []
    verified = verify(
        replace(JOB, ceilings={8: 4000.0}), configs, 2, measurer,
        on_measured=lambda done, total, name, repeat, _: seen.append((done, total, name, repeat)),
        slot_base=10,
    )  # fmt: skip
    assert measurer.calls == ["w0@11", "w1@12", "ceiling x1", "w1@13", "ceiling x1", "w0@14"]
    assert seen == [(1, 4, "a", 1), (2, 4, "b", 1), (3, 4, "b", 2), (4, 4, "a", 2)]
    assert verified.ceilings == {8: 9000.0}
    for candidate in verified.candidates:
        for outcome in candidate.outcomes:
            assert outcome.metrics is not None and outcome.ceiling_samples_per_s == 9000.0
            assert outcome.efficiency == pytest.approx(outcome.metrics.samples_per_s / 9000.0)
            assert outcome.metrics.util == pytest.approx(outcome.efficiency)  # CPU util


def test_a_ceiling_that_fails_ends_a_search_but_only_warns_the_bench() -> None:
    class Failing(LocalMeasurer):
        def ceiling(self, job: TrialJob, batch_size: int, windows: int = 3) -> tuple[int, float]:
            raise RuntimeError("the model raised")

    with pytest.raises(SearchFailedError, match="RuntimeError: the model raised"):
        measure_ceilings(JOB, [8], Failing(), _Quiet())
    quiet = _Quiet()
    assert measure_ceilings(JOB, [8], Failing(), quiet, required=False) == {}
    assert "batch size 8" in quiet.warnings[0]


def test_the_real_ceiling_is_measured_in_this_process() -> None:
    ((batch, speed),) = measure_ceilings(JOB, [8], LocalMeasurer(), _Quiet()).items()
    assert batch == 8 and speed > 0


def test_verification_takes_both_baselines_and_the_best_distinct_trials() -> None:
    space = SearchSpace(max_workers=2, batch_sizes=(8,), cuda=False, usable_cpus=2)
    two = LoaderConfig(8, 2, 4, False, True)
    one = LoaderConfig(8, 1, 2, False, False)
    records = [
        record("t1", "ok", config=space.baselines()["heuristic"], util=0.9),
        record("t2", "stopped_early", config=one, util=0.95),  # stopped: ranked after ok
        record("t3", "ok", config=two, util=0.8),
        record("t4", "failed", config=LoaderConfig(8, 2, 8, False, True), util=0.99),
    ]
    configs = verification_configs(records, space, top=2, objective="util")
    assert list(configs) == ["pytorch-default", "heuristic", "top-1", "top-2"]
    assert (configs["top-1"], configs["top-2"]) == (two, one)


def test_verification_takes_trusted_trials_before_unsteady_ones_or_defects() -> None:
    """A trial whose window was not steady, or that beat the final ceiling, is verified
    only after the trusted ones, however high it measured."""
    space = SearchSpace(max_workers=2, batch_sizes=(8,), cuda=False, usable_cpus=2)
    deep = LoaderConfig(8, 2, 8, False, True)
    unsteady = LoaderConfig(8, 2, 4, False, False)
    good = LoaderConfig(8, 1, 2, False, False)
    ceiling = 500.0
    records = [
        record("t1", "ok", config=deep, samples_per_s=585.0, util_source="step-timing"),
        record("t2", "ok", config=unsteady, samples_per_s=480.0, steady=False),
        record("t3", "ok", config=good, samples_per_s=450.0, steady=True),
    ]
    rebased = [r.rebased(ceiling) for r in records]
    assert rebased[0].bounds and "585" in rebased[0].bounds and not rebased[0].trusted
    assert not rebased[2].bounds and rebased[2].efficiency == pytest.approx(0.9)
    configs = verification_configs(rebased, space, top=1, objective="samples_per_s")
    assert configs["top-1"] == good


class Scripted(LocalMeasurer):
    """Each configuration's samples/s come from a script, by its workers, in order."""

    def __init__(self, speeds: dict[int, list[float]], unsteady: int | None = None) -> None:
        self.speeds = speeds
        self.unsteady = unsteady  # the workers whose windows are not steady
        self.calls: list[int] = []

    def measure(self, job: TrialJob, config: LoaderConfig, slot: int = 0) -> TrialOutcome:
        from raytune_loader.measuring.outcomes import SegmentMetrics

        self.calls.append(config.num_workers)
        speed = self.speeds[config.num_workers].pop(0)
        metrics = SegmentMetrics(speed, 0.1, speed / 1000, "step-timing", None, 100, 1.0)
        if config.num_workers == self.unsteady:
            metrics = replace(metrics, steady=False, steady_ratio=1.5)
        return TrialOutcome(config, 1 + config.num_workers, 0, metrics, effective_batch_size=8)


@pytest.mark.parametrize(
    ("speeds", "rounds"),
    [
        ({0: [250, 260, 255, 252, 251], 2: [500, 510, 505, 502, 501]}, 2),  # apart: 2 rounds
        ({0: [480, 520, 500, 490, 510], 2: [500, 510, 495, 505, 498]}, 3),  # the same: 3
        ({0: [300, 520, 280, 600, 250], 2: [500, 290, 505, 510, 498]}, 5),  # unsettled: all
    ],
    ids=["separated", "within-noise", "undecided"],
)
def test_verification_runs_as_many_rounds_as_the_evidence_needs(
    speeds: dict[int, list[float]], rounds: int
) -> None:
    configs = {"none": LoaderConfig(8), "two": LoaderConfig(8, 2, 2)}
    verified = verify(JOB, configs, 5, Scripted(speeds), objective="samples_per_s")
    assert verified.rounds == rounds
    assert all(len(c.outcomes) == rounds for c in verified.candidates)


class _Inputs(Scripted):
    """Scripted rates, and the input pipeline alone's readings from a script too."""

    def __init__(self, speeds: dict[int, list[float]], inputs: list[float]) -> None:
        super().__init__(speeds)
        self.inputs = inputs
        self.input_calls = 0

    def input_rate(self, job: TrialJob, config: LoaderConfig) -> InputRate:
        self.input_calls += 1
        return InputRate(self.inputs.pop(0), 100.0)


@pytest.mark.parametrize(
    ("inputs", "kept", "calls"),
    [
        ([600.0], 600.0, 1),  # above the winner's 505 samples/s: measured once
        ([530.0], 530.0, 1),  # within 5% of it: noise, not a defect
        ([480.0, 560.0], 560.0, 2),  # under it beyond 5%: measured again, the better kept
        ([440.0, 470.0, 520.0], 520.0, 3),  # twice under it (a noisy VM): a third time
        ([440.0, 430.0, 450.0], 450.0, 3),  # under it every time: the defect the limit names
    ],
)
def test_an_input_pipeline_measured_under_the_trained_rate_is_measured_again(
    inputs: list[float], kept: float, calls: int
) -> None:
    configs = {"none": LoaderConfig(8), "two": LoaderConfig(8, 2, 2)}
    measurer = _Inputs({0: [250, 260, 255, 252, 251], 2: [500, 510, 505, 502, 501]}, inputs)
    verified = verify(JOB, configs, 5, measurer, objective="samples_per_s")
    found = with_input_rates(verified, JOB, "samples_per_s", measurer, _Quiet())
    assert measurer.input_calls == calls
    assert {n: r.samples_per_s for n, r in found.input_rates.items()} == {"two": kept}


THREE = {"none": LoaderConfig(8), "one": LoaderConfig(8, 1, 2), "two": LoaderConfig(8, 2, 2)}


def trial(name: str, speed: float, start: float, status: str = "ok", **more: Any) -> Any:
    """A steady search trial of ``THREE[name]`` that ran alone for 10 s from ``start``."""
    return record(name, status, config=THREE[name], samples_per_s=speed, steady=True,
                  effective_batch_size=8, cpus_reserved=1.0, finished_at=start + 10.0,
                  time_total_s=10.0, **more)  # fmt: skip


def test_a_configuration_out_of_reach_of_the_best_is_not_measured_again() -> None:
    """A slow baseline on a bucket (21 samples/s against 529) is measured once: its
    threefold gap no run could close. One 2.5x below is measured every round until the
    runs decide, as is any configuration when the best's windows were not steady."""
    configs = THREE
    speeds = {0: [21, 22, 21], 1: [200, 205, 202], 2: [529, 517, 542]}
    measurer = Scripted({k: list(v) for k, v in speeds.items()})
    verified = verify(JOB, configs, 3, measurer, objective="samples_per_s")
    runs = {c.name: len(c.outcomes) for c in verified.candidates}
    assert runs == {"none": 1, "one": 2, "two": 2} and verified.rounds == 2
    assert measurer.calls == [0, 1, 2, 1, 2]
    # the best unsteady: its figure cannot rule the others out
    unsteady = Scripted({k: list(v) for k, v in speeds.items()}, unsteady=2)
    pair = {"none": configs["none"], "two": configs["two"]}
    verified = verify(JOB, pair, 3, unsteady, objective="samples_per_s")
    assert {c.name: len(c.outcomes) for c in verified.candidates} == {"none": 2, "two": 2}
    # the far one's own window not steady: something passing may have hit it
    hit = Scripted({k: list(v) for k, v in speeds.items()}, unsteady=0)
    verified = verify(JOB, configs, 3, hit, objective="samples_per_s")
    assert {c.name: len(c.outcomes) for c in verified.candidates}["none"] == 2
    # without an objective (the bench), every configuration runs every round
    plain = Scripted({k: list(v) for k, v in speeds.items()})
    verify(JOB, configs, 3, plain)
    assert len(plain.calls) == 9


def test_a_configuration_the_search_already_measured_out_of_reach_is_not_measured() -> None:
    """A trial that ran alone (one at a time, as on one CPU machine) is measured as a
    verification run is: a baseline whose trial was 3x or more below the best trial's is
    not measured again, its trial its one run. Not so where the trials overlapped (the
    GPU slices of a search side by side), where ASHA stopped it, where its window was
    not steady, or where it is within reach."""
    from raytune_loader.verdict.verify import searched_runs

    configs = THREE

    alone = [trial("none", 20.0, 0.0), trial("one", 200.0, 10.0), trial("two", 520.0, 20.0)]
    searched = searched_runs(alone, configs)
    assert {n: o.metrics.samples_per_s for n, o in searched.items()} == {  # type: ignore[union-attr]
        "none": 20.0, "one": 200.0, "two": 520.0}  # fmt: skip
    measurer = Scripted({1: [201, 203, 202], 2: [529, 517, 542]})
    planned: list[int] = []
    verified = verify(JOB, configs, 3, measurer, objective="samples_per_s", searched=searched,
                      on_start=planned.append)  # fmt: skip
    assert measurer.calls == [1, 2, 1, 2]  # "none" never measured; the rest as before
    assert planned == [6]  # the progress's total leaves it out from the start
    runs = {c.name: [o.metrics.samples_per_s for o in c.outcomes] for c in verified.candidates}  # type: ignore[union-attr]
    assert runs == {"none": [20.0], "one": [201, 203], "two": [529, 517]}
    # side by side (the best trial overlapped the others by 5 s): nothing counts
    beside = [*alone[:2], trial("two", 520.0, 15.0)]
    assert searched_runs(beside, configs) == {"none": searched["none"]}
    # a stopped trial's short window, an unsteady one, or no span: none counts either
    assert "none" not in searched_runs([trial("none", 20.0, 0.0, "stopped_early"), *alone[1:]],
                                       configs)  # fmt: skip
    shaky = [replace(alone[0], metrics=replace(alone[0].metrics, steady=False)), *alone[1:]]
    assert "none" not in searched_runs(shaky, configs)
    assert searched_runs([replace(alone[0], finished_at=None), *alone[1:]], configs) == {}
    # a trial that raised may have run on past its last report: beside it none is alone;
    # one that never started (Ctrl-C while it waited) ran beside nothing
    raised = record("t9", "error", config=LoaderConfig(8, 1, 4), samples_per_s=300.0,
                    finished_at=5.0, time_total_s=1.0)  # fmt: skip
    assert searched_runs([*alone, raised], configs) == {}
    assert searched_runs([*alone, record("t10", "interrupted")], configs) == searched
    # within reach (2.5x): measured every round as before
    near = Scripted({0: [210, 212], 1: [201, 203], 2: [529, 517]})
    within = [trial("none", 210.0, 0.0), *alone[1:]]
    verify(JOB, configs, 3, near, objective="samples_per_s",
           searched=searched_runs(within, configs))  # fmt: skip
    assert sorted(near.calls) == [0, 0, 1, 1, 2, 2]


def test_a_run_that_beats_the_ceiling_has_it_measured_again_before_it_is_left_out() -> None:
    """A model-bound loader trains at the ceiling, so a ceiling measured while the machine
    was busy refuses its good runs: the ceiling is measured once more, the best of its
    full windows, at that batch size; a run that still beats it is left out."""

    class Bounded(Scripted):
        def __init__(self, speeds: dict[int, list[float]], ceilings: list[float]) -> None:
            super().__init__(speeds)
            self.ceilings, self.windows = ceilings, []

        def ceiling(self, job: TrialJob, batch_size: int, windows: int = 3) -> tuple[int, float]:
            self.windows.append(windows)
            return batch_size, self.ceilings.pop(0)

    configs = {"none": LoaderConfig(8), "two": LoaderConfig(8, 2, 2)}
    job = replace(JOB, ceilings={8: 300.0})

    def two(final: float) -> tuple[list[float], tuple[str, ...], list[int]]:
        measurer = Bounded({0: [100, 101], 2: [330, 310]}, [290.0, final, 295.0])
        verified = verify(job, configs, 2, measurer, objective="samples_per_s")
        (best,) = [c for c in verified.candidates if c.name == "two"]
        return [o.metrics.samples_per_s for o in best.ok], best.refused, measurer.windows  # type: ignore[union-attr]

    # 330 beat 300 beyond noise in the first round: measured again at once, at 340,
    # before the rounds judge; both runs are its figures
    assert two(340.0) == ([330, 310], (), [1, 3, 1])
    kept, refused, _ = two(305.0)  # still beaten (330 against 305): left out, said why
    assert kept == [310] and len(refused) == 1 and "330" in refused[0]
    # nothing beaten: no more measurement than a ceiling in each round
    measurer = Bounded({0: [100, 101], 2: [280, 290]}, [290.0, 295.0])
    verify(job, configs, 2, measurer, objective="samples_per_s")
    assert measurer.windows == [1, 1]


def test_one_left_out_is_measured_again_when_the_best_falls_within_its_reach() -> None:
    """A baseline left out by its trial (3x below the best's) comes back when the best's
    verification runs fall within its reach, as on a machine loaded after the search: it
    is measured at once and in every round left, so its figures are never its trial's
    run alone."""
    from raytune_loader.verdict.verify import searched_runs

    configs = THREE

    searched = searched_runs([trial("none", 20.0, 0.0), trial("one", 200.0, 10.0),
                              trial("two", 520.0, 20.0)], configs)  # fmt: skip

    def runs(speeds: dict[int, list[float]]) -> tuple[dict[str, list[float]], list[int], list]:
        measurer, seen = Scripted(speeds), []
        heard = lambda done, total, *_: seen.append((done, total))  # noqa: E731
        verified = verify(JOB, configs, 2, measurer, objective="samples_per_s",
                          searched=searched, on_measured=heard)  # fmt: skip
        figures = {c.name: [o.metrics.samples_per_s for o in c.outcomes]  # type: ignore[union-attr]
                   for c in verified.candidates}  # fmt: skip
        return figures, measurer.calls, seen

    # loaded from the first round (55 and 58 against its 20): back at once, and after
    figures, calls, seen = runs({0: [21, 23], 1: [50, 52], 2: [55, 58]})
    assert figures == {"none": [20.0, 21, 23], "one": [50, 52], "two": [55, 58]}
    assert calls[:3] == [1, 2, 0] and sorted(calls[3:]) == [0, 1, 2]
    assert seen[-1] == (6, 6)  # the progress's total grew by its runs
    # loaded in the last round only (529, then 50): one run more after the rounds
    figures, calls, seen = runs({0: [22], 1: [201, 45], 2: [529, 50]})
    assert figures["none"] == [20.0, 22] and calls[-1] == 0 and seen[-1] == (5, 5)
    # still out of reach: its trial stays its one run
    figures, calls, _ = runs({1: [201, 203], 2: [529, 517]})
    assert figures["none"] == [20.0] and 0 not in calls


def test_the_best_tuned_ray_data_trial_is_verified_beside_ray_s_documented_pipeline() -> None:
    """Where Ray Data is offered and the top trials are DataLoaders, the best tuned Ray
    Data trial is verified too, beside the baselines (Ray's documented one among them)."""
    from raytune_loader import raydata

    space = SearchSpace(max_workers=2, batch_sizes=(8,), cuda=False, usable_cpus=2,
                        raydata_cpus=2.0)  # fmt: skip
    fast = LoaderConfig(8, 2, 4, False, True)
    tuned = raydata.RayDataConfig(8, 2, 2, map_batch_size=8).candidate()
    slower = raydata.RayDataConfig(8, 1, 1).candidate()
    records = [
        record("t1", "ok", config=fast, util=0.9),
        record("t2", "ok", config=space.baselines()["ray-docs-default"], util=0.5),
        record("t3", "ok", config=slower, util=0.4),
        record("t4", "ok", config=tuned, util=0.6),
    ]
    configs = verification_configs(records, space, top=1, objective="util")
    assert list(configs) == ["pytorch-default", "heuristic", "ray-docs-default", "top-1",
                             "top-raydata"]  # fmt: skip
    assert (configs["top-1"], configs["top-raydata"]) == (fast, tuned)
    plain = replace(space, raydata_cpus=0.0)
    assert "top-raydata" not in verification_configs(records[:1], plain, 1, "util")


def test_a_class_whose_nodes_are_gone_is_said_and_left_unverified() -> None:
    """A search resumed on other hardware holds trials whose nodes left the cluster:
    verifying them would pin runs to a node that no longer exists, so that class is
    said and left out; with every class here, or one class, or no Ray, all are kept."""
    from raytune_loader.measuring.records import NodeFacts
    from raytune_loader.verdict.classes import _live_classes

    def on(node: str, hw_class: str, trial: str) -> object:
        return replace(record(trial, "ok"), node=NodeFacts(node_id=node, hardware_class=hw_class))

    by_class = {"epyc-2": [on("gone", "epyc-2", "a"), on("gone", "epyc-2", "b")],
                "xeon-2": [on("here", "xeon-2", "c")]}  # fmt: skip
    quiet = _Quiet()
    assert list(_live_classes(by_class, {"here"}, quiet)) == ["xeon-2"]  # type: ignore[arg-type]
    (said,) = quiet.warnings
    assert said.startswith("epyc-2: its 2 trials ran on nodes no longer in the cluster")
    assert said.endswith("not verified, kept in trials.csv")
    assert _live_classes(by_class, {"here", "gone"}, quiet) == by_class  # type: ignore[arg-type]
    assert _live_classes(by_class, None, quiet) == by_class  # type: ignore[arg-type]
    assert _live_classes(by_class, {"elsewhere"}, quiet) == by_class  # type: ignore[arg-type]
    one = {"epyc-2": by_class["epyc-2"]}
    assert _live_classes(one, {"here"}, quiet) == one  # type: ignore[arg-type]
