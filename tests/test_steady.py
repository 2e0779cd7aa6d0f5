"""The steady window: the rate it measures, and when it is marked not steady."""

from __future__ import annotations

import pytest

from raytune_loader.measuring.steady import (
    Consumed,
    above_bound,
    above_ceiling,
    drained,
    over_budget,
    rate,
    short_half,
    steadiness,
    window_budget_s,
)


def _batches(costs: list[float | None], step_s: float, samples: int = 32) -> list[Consumed]:
    return [Consumed(samples, (i + 1) * step_s, cost) for i, cost in enumerate(costs)]


def test_a_loop_served_from_a_stock_measures_what_the_workers_produce() -> None:
    """24 batches trained in 0.24 s, each of which cost one of 2 workers 0.4 s: the
    workers make 5 batches a second, not the loop's 100."""
    found = rate(_batches([0.4] * 24, 0.01), start=0.0, makers=2)
    assert found.consumed_s == pytest.approx(0.24)
    assert found.produced_s == pytest.approx(0.4 * 24 / 2)
    assert found.samples_per_s == pytest.approx(32 * 24 / 4.8)
    assert found.stretch == pytest.approx(4.8 / 0.24)


def test_a_loop_that_is_the_limit_measures_its_own_pace() -> None:
    found = rate(_batches([0.01] * 24, 0.1), start=0.0, makers=4)
    assert found.samples_per_s == pytest.approx(32 / 0.1)
    assert found.stretch == 1.0


def test_batches_without_a_cost_count_at_the_others_mean() -> None:
    found = rate(_batches([None, 0.2, 0.2, 0.2], 0.01), start=0.0, makers=1)
    assert found.produced_s == pytest.approx(0.8)


def test_halves_that_agree_are_steady_and_halves_that_do_not_are_marked() -> None:
    held = steadiness(_batches([0.1] * 24, 0.05), 0.0, 1)
    assert held.steady and held.ratio == pytest.approx(1.0)
    # a stock that runs out in the middle: the first half consumed fast, the second paced
    costs = [0.1] * 24
    ends = [0.01 * (i + 1) for i in range(12)] + [0.12 + 0.1 * (i + 1) for i in range(12)]
    batches = [Consumed(32, end, cost) for end, cost in zip(ends, costs, strict=True)]
    moved = steadiness(batches, 0.0, 4)
    assert moved.steady is False and moved.ratio == pytest.approx(4.0, rel=0.05)
    assert steadiness(_batches([0.1] * 14, 0.05), 0.0, 1).steady is None  # too short
    # either way round: paced first, then a loop twice as fast that the workers keep up with
    ends = [0.1 * (i + 1) for i in range(12)] + [1.2 + 0.05 * (i + 1) for i in range(12)]
    costs = [0.4] * 12 + [0.2] * 12
    batches = [Consumed(32, end, cost) for end, cost in zip(ends, costs, strict=True)]
    slower_first = steadiness(batches, 0.0, 4)
    assert slower_first.steady is False and slower_first.ratio == pytest.approx(0.5)


def test_a_figure_beyond_its_bound_is_said_one_within_noise_is_not() -> None:
    assert above_ceiling(540.0, 534.0) is None
    note = above_ceiling(585.0, 534.0)
    assert note is not None and "585" in note and "534" in note and "defect" in note
    assert above_bound(4599.0, 4203.0, "the input pipeline alone") is not None
    assert above_bound(None, 4203.0, "x") is None and above_bound(10.0, None, "x") is None


def test_ranks_are_steady_together_and_report_the_worst_ratio() -> None:
    from raytune_loader.measuring.outcomes import SegmentMetrics, merge_ranks

    def rank(speed: float, ratio: float | None, held: bool | None) -> SegmentMetrics:
        return SegmentMetrics(speed, 0.1, 0.5, "step-timing", None, 320, 1.0, held, ratio)

    node = merge_ranks([rank(100, 1.02, True), rank(90, 0.97, True)])
    assert (node.steady, node.steady_ratio, node.samples_per_s) == (True, 0.97, 180)
    node = merge_ranks([rank(100, 1.1, True), rank(100, 0.8, False)])  # 1.25x, either way
    assert node.steady is False and node.steady_ratio == 0.8
    assert merge_ranks([rank(1, None, None), rank(1, None, None)]).steady is None


def test_a_window_may_end_past_its_budget_only_once_its_halves_can_be_compared() -> None:
    budget = window_budget_s(1536, 1000.0)  # 48 steps of 32 at a ceiling of 1000/s
    assert budget == pytest.approx(15.36)
    slow = _batches([None] * 16, step_s=4.0)  # 8 samples/s: 16 s for 4 batches
    assert over_budget(slow[:4], 0.0, budget, makers=1)
    assert not over_budget(slow[:3], 0.0, budget, makers=1)  # past it, but halves of 1 and 2
    assert not over_budget(slow[:3], 0.0, 10.0, makers=1)
    assert not over_budget(slow[:4], 0.0, 16.5, makers=1)  # the halves, not yet the budget
    assert not over_budget(slow, 0.0, window_budget_s(1536, None), makers=1)  # no ceiling
    # a batch from each maker in each half: four makers at once, halves of four
    assert not over_budget(slow[:7], 0.0, budget, makers=4) and over_budget(
        slow[:8], 0.0, budget, 4
    )
    assert short_half(1) == 2 and short_half(4) == 4 and short_half(32) == 8  # never past 8


def test_a_cut_window_judges_its_short_halves() -> None:
    """Four batches: too short for a whole window's halves, judged with a cut one's."""
    even = _batches([0.1] * 4, 0.1)
    assert steadiness(even, 0.0, 1).steady is None
    assert steadiness(even, 0.0, 1, least=short_half(1)).steady is True
    ends = [0.1, 0.2, 0.6, 1.0]  # the second half 4x slower
    moved = [Consumed(32, end, 0.1) for end in ends]
    assert steadiness(moved, 0.0, 1, least=2).steady is False


def test_a_drain_ends_early_only_past_its_budget_and_once_the_loop_waited_a_step() -> None:
    step = 0.032  # a step of 32 at a ceiling of 1000/s, or the loop's own last
    budget = window_budget_s(8 * 32, 1000.0)  # 2.56 s for a drain of 8 batches
    assert drained(0.5, 3.0, budget, step)
    assert not drained(0.5, 2.0, budget, step)  # waited, but within its budget
    assert not drained(0.03, 3.0, budget, step)  # within a step: a batch of the stock
    assert not drained(0.5, 3.0, budget, 0.6)  # a step slower than the wait
    assert not drained(0.5, 3.0, None, step)  # no ceiling, or several ranks
