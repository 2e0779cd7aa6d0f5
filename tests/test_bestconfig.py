"""The content of best_config.json, from verification candidates and trial records."""

from __future__ import annotations

from dataclasses import replace

import pytest

from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.measuring.outcomes import InputRate, SegmentMetrics, TrialOutcome
from raytune_loader.outputs.bestconfig import (
    SearchContext,
    _baselines,
    _limit,
    best_config,
    metrics_of,
)
from raytune_loader.outputs.console import limit_line
from raytune_loader.sources.datasets import DatasetSpec
from raytune_loader.tuning.options import SearchOptions
from raytune_loader.tuning.space import HEURISTIC, PYTORCH_DEFAULT, RAY_DOCS, SearchSpace
from raytune_loader.verdict.selection import Candidate, fitting


def _run(config: LoaderConfig, speed: float, ceiling: float | None = None, **extra) -> TrialOutcome:
    metrics = SegmentMetrics(speed, 0.1, 0.9, "step-timing", None, 320, 1.0)
    return TrialOutcome(config, 1, 0, metrics, ceiling_samples_per_s=ceiling, **extra)


def test_after_an_oom_back_off_the_json_gives_the_batch_size_that_fits() -> None:
    config = LoaderConfig(batch_size=4096)
    ran = _run(config, 100, effective_batch_size=1024, oom_backoffs=2)
    candidate = Candidate("top-1", config, (ran, ran))
    assert fitting(candidate).batch_size == 1024
    metrics = metrics_of(candidate)
    assert (metrics["requested_batch_size"], metrics["effective_batch_size"]) == (4096, 1024)
    assert metrics["oom_backoffs"] == 4


def test_a_heuristic_clipped_by_max_workers_says_so_in_the_json() -> None:
    space = SearchSpace(max_workers=3, batch_sizes=(32,), cuda=False, usable_cpus=12)
    assert space.baselines()[HEURISTIC].num_workers == 3
    by_name = {name: Candidate(name, config, ()) for name, config in space.baselines().items()}
    out = _baselines(by_name, space.heuristic_note, space.pipeline)
    assert out[HEURISTIC]["note"] == (
        "num_workers is --max-workers 3, below the rule of thumb min(usable CPUs, 8) = 8"
    )
    assert "note" not in out[PYTORCH_DEFAULT]


def test_efficiency_is_the_median_share_of_the_ceiling() -> None:
    config = LoaderConfig(batch_size=32)
    candidate = Candidate("tuned", config, tuple(_run(config, s, 400.0) for s in (200, 300, 320)))
    metrics = metrics_of(candidate)
    assert metrics["efficiency"]["median"] == 0.75 and "ceiling_note" not in metrics


def test_an_efficiency_above_one_within_noise_is_reported_as_a_ceiling_too_low() -> None:
    config = LoaderConfig(batch_size=32)
    candidate = Candidate("tuned", config, tuple(_run(config, s, 300.0) for s in (309, 312)))
    metrics = metrics_of(candidate)
    assert metrics["efficiency"] is None
    assert "measured too low" in metrics["ceiling_note"] and "1.04" in metrics["ceiling_note"]
    assert "refused" not in metrics


def test_a_run_above_the_ceiling_beyond_noise_is_refused_and_said() -> None:
    """585 samples/s against a ceiling of 534 (grid.json's defect): not a figure to report."""
    config = LoaderConfig(batch_size=32)
    runs = (_run(config, 500, 534.0), _run(config, 585, 534.0), _run(config, 510, 534.0))
    candidate = Candidate("tuned", config, runs)
    metrics = metrics_of(candidate)
    assert metrics["samples_per_s"]["values"] == [500, 510]  # the defect left out
    assert len(metrics["refused"]) == 1 and "585" in metrics["refused"][0]
    assert "above the ceiling" in metrics["refused"][0] and "534" in metrics["refused"][0]


def test_training_faster_than_its_input_alone_is_a_defect_not_a_limit() -> None:
    config = LoaderConfig(batch_size=32)
    candidate = Candidate("tuned", config, tuple(_run(config, s) for s in (4599, 4600)))
    limit = _limit(candidate, InputRate(4203.0, 370.0))["limit"]
    assert limit["bound"] == "defect" and "input pipeline alone" in limit["defect"]
    assert "input-bound" not in (limit_line(limit) or "")
    assert limit_line(limit).startswith("defect: training measured 4600")


@pytest.mark.parametrize(
    ("alone", "bound", "headroom"), [(330.0, "input", 0.1), (600.0, "model", 1.0)]
)
def test_the_limit_is_the_input_when_it_alone_barely_outruns_training(
    alone: float, bound: str, headroom: float
) -> None:
    config = LoaderConfig(batch_size=32)
    candidate = Candidate("tuned", config, tuple(_run(config, s) for s in (290, 300, 310)))
    limit = _limit(candidate, InputRate(alone, 180.0))["limit"]
    assert limit["bound"] == bound and limit["headroom"] == pytest.approx(headroom)
    assert (limit["trained_samples_per_s"], limit["per_core_samples_per_s"]) == (300, 180.0)
    assert _limit(candidate, None) == {}


def test_a_loop_that_waits_for_data_is_not_model_bound_however_fast_its_input_alone() -> None:
    """Shards from a bucket on two cores: 249 samples/s trained, waiting 53% of the time
    for data, where the input alone gave 776. Not model-bound: beside the step the
    workers do less. The same figures waiting 10% of the time are model-bound."""
    from dataclasses import replace

    config = LoaderConfig(batch_size=16)

    def waiting(share: float) -> Candidate:
        runs = tuple(replace(r, metrics=replace(r.metrics, data_wait_frac=share))
                     for r in (_run(config, 241), _run(config, 257)))  # fmt: skip
        return Candidate("tuned", config, runs)

    limit = _limit(waiting(0.53), InputRate(776.0, 78.0))["limit"]
    assert limit["bound"] == "shared" and limit["data_wait_frac"] == pytest.approx(0.53)
    assert limit_line(limit).startswith(
        "input-bound beside the step: training took 249 samples/s and waited for data 53%"
    )
    assert _limit(waiting(0.1), InputRate(776.0, 78.0))["limit"]["bound"] == "model"
    assert _limit(waiting(0.53), InputRate(260.0, 78.0))["limit"]["bound"] == "input"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_training_well_below_both_the_model_alone_and_the_input_alone_is_contended(
    device: str,
) -> None:
    """The default search's figures: 758 samples/s trained without waiting, the model
    alone 1127, the input alone 1252. Neither is the limit, so not model-bound; the same
    run at 1000 of the 1127 is."""
    config = LoaderConfig(batch_size=32, num_workers=2)

    def trained(*speeds: float) -> Candidate:
        return Candidate("tuned", config, tuple(_run(config, s, 1127.0) for s in speeds))

    limit = _limit(trained(733, 758, 782), InputRate(1252.0, 700.0), device)["limit"]
    assert limit["bound"] == "contended"
    assert limit["ceiling_share"] == pytest.approx(758 / 1127)
    line = limit_line(limit)
    assert line.startswith(
        "contended: training took 758 samples/s, waiting for data 10% of the time, 67% of "
        "the model's 1127 on a resident batch, where the input pipeline alone delivers 1252"
    )
    assert ("share its cores" in line) == (device == "cpu"), line
    assert "What if" not in line  # a resumed search has no estimates to point at
    pointed = limit_line(limit, what_if=True)
    assert ("What if estimates bigger nodes; one core" in pointed) == (device == "cpu")
    for said in (line, pointed):
        assert said.endswith("one core decodes and augments 700 samples/s)")
        assert "; ;" not in said and "(;" not in said and "((" not in said, said
    for speeds, bound in [((990, 1000), "model"), ((900, 910), "model"), ((880, 890), "contended")]:
        assert _limit(trained(*speeds), InputRate(1252.0, 700.0), device)["limit"]["bound"] == bound
    unknown = Candidate("tuned", config, (_run(config, 758),))  # no ceiling: as before
    assert _limit(unknown, InputRate(1252.0, 700.0), device)["limit"]["bound"] == "model"


def _raydata_candidates() -> list[Candidate]:
    """A tuned DataLoader, Ray's documented pipeline and a tuned Ray Data pipeline,
    verified: the tuned Ray Data one the fastest, or the DataLoader."""
    from raytune_loader import raydata

    loader = LoaderConfig(32, 2, 2, False, True)
    docs = raydata.ray_docs_default(32, max_actors=4).candidate()
    tuned = raydata.RayDataConfig(32, 4, 4, map_batch_size=32, prefetch_batches=2,
                                  crosses="uint8").candidate()  # fmt: skip
    return [
        Candidate(PYTORCH_DEFAULT, LoaderConfig(32), (_run(LoaderConfig(32), 100),) * 2),
        Candidate(HEURISTIC, loader, (replace(_run(loader, 300), cpus_reserved=3.0),) * 2),
        Candidate(RAY_DOCS, docs, (replace(_run(docs, 150), cpus_reserved=5.0),) * 2),
        Candidate("top-1", tuned, (replace(_run(tuned, 600), cpus_reserved=5.0),) * 2),
    ]


def _context(space: SearchSpace) -> SearchContext:
    job = TrialJob(DatasetSpec("synthetic-imagenet", "/nowhere"), "small-cnn", SegmentSpec())
    options = SearchOptions(objective="samples_per_s")
    return SearchContext(options, space, job, 0.0, 0.0, 1, False, "tpe", "asha")


def test_a_ray_data_winner_is_the_engine_and_loader_stays_the_best_dataloader() -> None:
    """.dataloader() still builds the best verified DataLoader; the raydata section has
    the winner's pipeline, its figures, what it reserved and its speed over both."""
    space = SearchSpace(2, (32,), False, 2, raydata_cpus=4.0)
    best = best_config(_context(space), _raydata_candidates(), [])
    assert best["engine"] == "raydata" and best["selection"]["chosen"] == "top-1"
    assert best["loader"] == LoaderConfig(32, 2, 2, False, True).kwargs()
    section = best["raydata"]
    assert section["chosen"] and section["name"] == "top-1"
    assert section["config"]["max_actors"] == 4 and section["config"]["crosses"] == "uint8"
    assert section["speedup_vs_dataloader"] == pytest.approx(2.0)
    assert section["reserved"] == {"trial_cpus": 1.0, "actor_cpus": 4.0, "offered_cpus": 4.0}
    assert best["speedup"]["vs_ray_docs_default"] == pytest.approx(4.0)
    assert best["baselines"][RAY_DOCS]["raydata"]["min_actors"] == 1
    runner = next(r for r in best["selection"]["runners_up"] if r["name"] == RAY_DOCS)
    assert runner["engine"] == "raydata" and "loader" not in runner
    assert best["search"]["space"]["raydata_cpus"] == 4.0


def test_the_baselines_rows_read_the_data_as_their_runs_did() -> None:
    """On a stream every candidate, the baselines too, reads the stream: the summary's
    and the report's rows say so (they said ``map`` when the file kept only the
    baselines' DataLoader arguments)."""
    from raytune_loader.outputs.console import summary_rows

    def stream(workers: int, prefetch: int | None) -> LoaderConfig:
        return LoaderConfig.from_dict({"num_workers": workers, "prefetch_factor": prefetch,
                                       "access": "stream"}, batch_size=16)  # fmt: skip

    configs = {PYTORCH_DEFAULT: stream(0, None), HEURISTIC: stream(2, 2), "top-1": stream(1, 4)}
    candidates = [
        Candidate(name, config, (_run(config, speed),) * 2)
        for (name, config), speed in zip(configs.items(), (100, 200, 300), strict=True)
    ]
    best = best_config(_context(SearchSpace(2, (16,), False, 2, pipeline=True)), candidates, [])
    rows = {row["config"]: row for row in summary_rows(best)}
    assert {name: row["access"] for name, row in rows.items()} == dict.fromkeys(
        ("tuned", PYTORCH_DEFAULT, HEURISTIC), "stream"
    )


def test_a_dataloader_winner_keeps_ray_data_as_the_runner_up() -> None:
    candidates = _raydata_candidates()
    slow = replace(candidates[3], outcomes=(_run(candidates[3].config, 200),) * 2)
    best = best_config(_context(SearchSpace(2, (32,), False, 2, raydata_cpus=4.0)),
                       [*candidates[:3], slow], [])  # fmt: skip
    assert best["engine"] == "dataloader" and best["selection"]["chosen"] == HEURISTIC
    assert not best["raydata"]["chosen"] and best["raydata"]["name"] == "top-1"
    assert best["raydata"]["speedup_vs_dataloader"] == pytest.approx(200 / 300)
    plain = best_config(_context(SearchSpace(2, (32,), False, 2)), candidates[:2], [])
    assert "raydata" not in plain and plain["engine"] == "dataloader"


def test_what_if_estimates_are_calibrated_as_the_trials_of_their_part_were() -> None:
    """The estimates for bigger nodes scale each row by the factor the search's trials
    calibrated the part that bounds it by; a part no trial was bound by stays the
    profile's."""
    from raytune_loader.measuring.profile import Profile
    from raytune_loader.outputs.bestconfig import _what_if
    from raytune_loader.tuning.costmodel import CostModel, what_if

    profile = Profile(32, 2, per_core={"pil/float32": 100.0},
                      receive_s={"process/float32": 0.004})  # fmt: skip
    model = CostModel(profile, {32: 400.0})
    config = LoaderConfig.from_dict({"num_workers": 2}, batch_size=32)
    raw = what_if(model, config, [2, 4, 8, 16])
    bounds = {node["bound"] for node in raw}
    assert len(bounds) > 1  # the cores bound a small node, the step a big one
    calibrated = {min(bounds): 0.5}
    ctx = replace(_context(SearchSpace(2, (32,), False, 2)), model=model,
                  search={"method": "model", "calibration": calibrated})  # fmt: skip
    found = _what_if(ctx, config)["what_if"]["nodes"]
    for before, after in zip(raw, found, strict=True):
        factor = calibrated.get(before["bound"], 1.0)
        assert after["samples_per_s"] == pytest.approx(before["samples_per_s"] * factor, abs=0.1)
    assert all("measured_samples_per_s" not in node for node in found)  # none was given
    found = _what_if(ctx, config, measured=491.0)["what_if"]["nodes"]
    measured = [
        (n["cores"], n["measured_samples_per_s"]) for n in found if "measured_samples_per_s" in n
    ]
    assert measured == [(2, 491.0)]  # this node, the winner's 2 workers: what was measured
    other = LoaderConfig.from_dict({"num_workers": 1}, batch_size=32)  # 2 on its own node
    assert all(
        "measured_samples_per_s" not in n for n in _what_if(ctx, other, 491.0)["what_if"]["nodes"]
    )


def test_when_every_configuration_failed_the_first_reason_is_said_whole() -> None:
    """No result: the first trial's reason whole (not cut in mid-sentence), the count of
    the others; where every trial failed on a corrupt sample the data is at fault (a
    DatasetError, exit status 2) and the line says what to do with the file."""
    from raytune_loader.errors import DatasetError, SearchFailedError
    from raytune_loader.measuring.records import TrialRecord

    context = _context(SearchSpace(2, (32,), False, 2))
    bad = "/data/train/b/000002.JPEG"
    long = f"corrupt sample {bad}: ValueError: Unsupported or unrecognized image format. " + (
        "Supported formats are " + ", ".join(["jpeg", "png", "gif", "webp"] * 30)
    )
    reason = f"corrupt_sample: CorruptSampleError: {long}"  # as a worker's error says it
    corrupt = [TrialRecord(str(i), "failed", reason) for i in range(3)]
    corrupt.append(TrialRecord("3", "failed", f"corrupt_sample: corrupt sample {bad}: other"))
    with pytest.raises(DatasetError) as raised:
        best_config(context, [], corrupt)
    said = str(raised.value)
    assert said == (
        f"every configuration failed on a {long}; remove or replace that "
        "file and run the search again (1 other reason in trials.partial.csv)"
    )
    # one file, whatever wraps its error (a worker's, then Ray's), is one reason
    ray_s = "raytune_loader.errors.CorruptSampleError"
    wrapped = f"corrupt_sample: CorruptSampleError: {ray_s}: {long}"
    with pytest.raises(DatasetError) as raised:
        best_config(context, [], [*corrupt[:3], TrialRecord("4", "failed", wrapped)])
    assert str(raised.value).endswith("run the search again")  # no other reason
    mixed = [TrialRecord("0", "failed", "data_loader: worker 1 died"), *corrupt[:1]]
    with pytest.raises(SearchFailedError, match=r"failed: data_loader: worker 1 died \(1 other"):
        best_config(context, [], mixed)
    with pytest.raises(SearchFailedError, match="failed: no trial finished$"):
        best_config(context, [], [TrialRecord("0", "error")])
