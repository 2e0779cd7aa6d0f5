"""Choosing the winner from repeated verification runs."""

from __future__ import annotations

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.outcomes import SegmentMetrics, TrialOutcome
from raytune_loader.verdict.selection import Candidate, Stats, decided, rotated, select


def _candidate(
    name: str, workers: int, utils: list[float], host: int = 0, persistent: bool = False
) -> Candidate:
    config = LoaderConfig.from_dict(
        {"num_workers": workers, "persistent_workers": persistent}, batch_size=32
    )
    outcomes = tuple(
        TrialOutcome(
            config,
            cpus_reserved=1 + workers,
            host_bytes_in_flight=host,
            metrics=SegmentMetrics(100 * u, 1 - u, u, "step-timing", None, 320, 1.0),
        )
        for u in utils
    )
    return Candidate(name, config, outcomes)


def test_stats() -> None:
    stats = Stats.of([3.0, 1.0, 2.0])
    assert (stats.median, stats.min, stats.max) == (2.0, 1.0, 3.0)


def test_cheapest_within_noise_wins_and_says_so() -> None:
    best = _candidate("eight", 8, [0.90, 0.86, 0.92])
    close = _candidate("four", 4, [0.89, 0.88, 0.87])  # median 0.88 >= best's min 0.86
    far = _candidate("zero", 0, [0.40, 0.41, 0.39])
    selection = select([far, best, close], "util")
    assert selection is not None
    assert selection.best_by_objective is best
    assert selection.winner is close and selection.decided_by_cost
    assert [c.name for c in selection.ranked] == ["eight", "four", "zero"]


def test_clear_winner_is_kept() -> None:
    best = _candidate("four", 4, [0.90, 0.89, 0.91])
    cheaper = _candidate("one", 1, [0.70, 0.72, 0.71])
    selection = select([cheaper, best], "util")
    assert selection is not None and selection.winner is best and not selection.decided_by_cost


def test_the_runs_not_a_fixed_cap_say_what_is_within_noise() -> None:
    """A data set that costs nothing to load: 2 workers measured 7,195-11,209 samples/s,
    no workers 8,744-12,626 (a real search's ranges). The runs cannot tell them apart,
    so the cheapest wins, however far apart the medians happen to fall."""
    two = _candidate("two", 2, [0.7195, 0.9500, 1.1209])
    none = _candidate("none", 0, [0.8744, 0.9100, 1.2626])
    wide = _candidate("wide", 1, [1.2, 0.3, 1.25])  # best median, its worst run very low
    cheap = _candidate("cheap", 0, [0.8, 0.8, 0.8])  # 33% below its median, above its worst
    assert select([two, none], "util").winner is none  # type: ignore[union-attr]
    selection = select([wide, cheap], "util")
    assert selection is not None and selection.winner is cheap and selection.decided_by_cost


def test_a_best_with_tight_runs_does_not_beat_a_cheaper_one_whose_runs_reach_past_it() -> None:
    """A real search's figures: two workers measured three runs within 1%, no workers
    three runs 13% apart around them. The old rule (the cheaper's median against the
    best's lowest run alone) chose the workers; either median inside the other's runs
    says the runs cannot tell them apart."""
    tight = _candidate("two", 2, [0.96, 0.966, 0.966])
    spread = _candidate("none", 0, [0.887, 1.022, 0.951])
    selection = select([tight, spread], "util")
    assert selection is not None and selection.best_by_objective is tight
    assert selection.winner is spread and selection.decided_by_cost
    below = _candidate("none", 0, [0.887, 0.95, 0.951])  # no run reaches the best's median
    assert select([tight, below], "util").winner is tight  # type: ignore[union-attr]


def test_rounds_stop_when_the_runs_decide() -> None:
    apart = [_candidate("best", 2, [0.9, 0.92]), _candidate("far", 0, [0.4, 0.42])]
    assert decided(apart, "util")  # separated after two rounds
    straddling = [_candidate("best", 2, [0.9, 0.8]), _candidate("unsure", 0, [0.85, 0.75])]
    assert not decided(straddling, "util")  # one run above the best's worst, one below
    within = [_candidate("best", 2, [0.9, 0.8]), _candidate("close", 0, [0.85, 0.82])]
    assert decided(within, "util")  # every run within the best's noise


def test_host_memory_breaks_cpu_ties() -> None:
    a = _candidate("more-memory", 2, [0.9, 0.9, 0.9], host=2000)
    b = _candidate("less-memory", 2, [0.9, 0.9, 0.9], host=1000)
    selection = select([a, b], "util")
    assert selection is not None and selection.winner is b


def test_persistent_workers_break_cost_ties_within_noise() -> None:
    """The measurement cannot see persistent_workers (one epoch); training can."""
    restarting = _candidate("restarting", 2, [0.91, 0.90, 0.92])
    persistent = _candidate("persistent", 2, [0.90, 0.89, 0.91], persistent=True)
    selection = select([restarting, persistent], "util")
    assert selection is not None and selection.winner is persistent
    assert selection.decided_by_cost


def test_all_failed_gives_none() -> None:
    config = LoaderConfig(batch_size=32)
    failed = Candidate("x", config, (TrialOutcome(config, 1, 0, failure="oom"),))
    assert select([failed], "util") is None


def test_rotation_starts_each_round_one_later() -> None:
    assert [name for _, name in rotated("abc", 3)] == list("abcbcacab")


def test_by_samples_per_s_a_busier_but_slower_candidate_loses() -> None:
    """Decoding on the GPU keeps it busier, yet trains fewer samples a second: GPU
    utilization would pick it, samples/s (the objective of such searches) does not."""

    def measured(decode: str, speed: float, util: float) -> Candidate:
        config = LoaderConfig(256, 8, 2, True, True, transfer="uint8", decode=decode)
        metrics = SegmentMetrics(speed, 0.1, util, "nvml-process", util, 256 * 60, 1.0)
        return Candidate(decode, config, tuple(TrialOutcome(config, 9, 0, metrics)
                                               for _ in range(3)))  # fmt: skip

    busy, fast = measured("device", 900.0, 0.95), measured("pil", 1000.0, 0.80)
    assert select([busy, fast], "util").winner is busy  # type: ignore[union-attr]
    assert select([busy, fast], "samples_per_s").winner is fast  # type: ignore[union-attr]


def test_a_candidate_whose_windows_were_not_steady_ranks_after_the_steady_ones() -> None:
    from dataclasses import replace

    fast = _candidate("deep-queue", 4, [0.95, 0.96, 0.94])
    unsteady = tuple(
        replace(o, metrics=replace(o.metrics, steady=False, steady_ratio=1.5))
        for o in fast.outcomes[:2]
    )
    fast = Candidate(fast.name, fast.config, unsteady + fast.outcomes[2:])
    steady = _candidate("steady", 2, [0.8, 0.82, 0.81])
    assert not fast.steady and steady.steady
    chosen = select([fast, steady], "util")
    assert chosen is not None and chosen.winner.name == "steady"
    assert [c.name for c in chosen.ranked] == ["steady", "deep-queue"]
    alone = select([fast], "util")  # with nothing steady, the best of the rest still wins
    assert alone is not None and alone.winner.name == "deep-queue"
