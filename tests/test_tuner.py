"""The driver side of Ray, on the CPU without starting Ray: the bundle a trial reserves,
the scheduler Tune runs, Ctrl-C during the run, resuming a saved experiment.

``tune.Tuner`` is replaced by a stand-in that keeps what it was given, so a test sees
the real trainable, searcher and scheduler that :func:`tuner.run_tune` hands Tune. The
slow tier starts the local Ray instance :func:`tuner.start_ray` starts, once.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
import ray
from ray.tune.schedulers import TrialScheduler
from ray.tune.trainable import wrap_function

from conftest import TESTS, Searched, ray_processes
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.job import SegmentSpec, TrialJob
from raytune_loader.sources.datasets import DatasetSpec
from raytune_loader.tuning import ray_logs, tuner
from raytune_loader.tuning.space import SearchSpace

JOB = TrialJob(
    DatasetSpec("datasets_for_tests:fast"), "small-cnn", SegmentSpec(steps=60, report_every=20),
    cpus_per_worker=0.5, node_cpus=4,
)  # fmt: skip
SPACE = SearchSpace(max_workers=2, batch_sizes=(16,), cuda=False, usable_cpus=2)


def _cluster(node_type: str | None = None) -> tuner.RayCluster:
    return tuner.RayCluster(None, node_cpus=4.0, gpus=1.0, max_node_gpus=1.0, nodes=1,
                            joined=False, node_type=node_type)  # fmt: skip


def _settings(tmp_path: Path, **changes: Any) -> tuner.TuneSettings:
    values: dict[str, Any] = dict(
        objective="util", num_samples=1, max_concurrent=1, time_budget_s=None,
        gpus_per_trial=0.0, seed=0, storage=str(tmp_path), name="search-test",
        verbose=True,  # leaves the process's Tune and Optuna logging settings alone
    )  # fmt: skip
    return tuner.TuneSettings(**{**values, **changes})


def _finished(trial_id: str, timestamp: float, error: Exception | None = None) -> Any:
    """One trial of a result grid, as Tune gives it."""
    return SimpleNamespace(
        error=error, path=f"/tune/search-test/trial_fn_{trial_id}_0_num_workers=0",
        config={"num_workers": 0}, metrics={"final": True, "trial_id": trial_id,
                                            "timestamp": timestamp, "util": 0.5},
    )  # fmt: skip


def _tune_s_handler(signum: int, frame: Any) -> None:
    pass


def _tune_ends_by_itself() -> None:
    """What Tune's fit does to SIGINT when no Ctrl-C comes: installs its handler, and
    leaves it installed."""
    signal.signal(signal.SIGINT, _tune_s_handler)


@dataclass
class FakeTune:
    """What ``run_tune`` gave ``tune.Tuner``, and what its ``fit`` does and returns."""

    results: list[Any] = field(default_factory=lambda: [_finished("t1", 1.0)])
    during_fit: Callable[[], None] = _tune_ends_by_itself
    made: list[dict[str, Any]] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)


@pytest.fixture
def fake_tune(monkeypatch: pytest.MonkeyPatch) -> FakeTune:
    fake = FakeTune()

    class Tuner:
        def __init__(self, trainable: Any, **kwargs: Any) -> None:
            fake.made.append({"trainable": trainable, **kwargs})

        @classmethod
        def restore(cls, path: str, trainable: Any, **kwargs: Any) -> Tuner:
            fake.restored.append(path)
            return cls(trainable)

        def fit(self) -> list[Any]:
            fake.during_fit()
            return fake.results

    monkeypatch.setattr(tuner.tune, "Tuner", Tuner)
    return fake


def _ignore(event: tuner.TrialEvent) -> None:
    pass


def test_a_bundle_is_the_cpus_the_gpu_share_and_a_sliver_of_the_node_type() -> None:
    assert _cluster().bundle(3, 0) == {"CPU": 3}
    assert _cluster().bundle(3, 0.5) == {"CPU": 3, "GPU": 0.5}
    labelled = _cluster("a100-node").bundle(3, 0.5)
    assert labelled == {"CPU": 3, "GPU": 0.5, "a100-node": tuner.NODE_TYPE_SHARE}
    assert 0 < tuner.NODE_TYPE_SHARE <= 0.01  # pins the node type, never limits trials on it


@pytest.mark.parametrize(
    ("workers", "ranks", "cpus"), [(0, 1, 1.0), (2, 1, 2.0), (10, 1, 4.0), (1, 2, 3.0)]
)
def test_each_trial_asks_tune_for_its_workers_cpus_capped_at_the_node(
    workers: int, ranks: int, cpus: float
) -> None:
    """1 + 0.5 CPU a worker, per rank, never more than the node's 4; plus the GPU share."""
    from dataclasses import replace

    trainable = tuner.trainable(replace(JOB, ranks=ranks), 0.5, _cluster())
    asked = wrap_function(trainable).default_resource_request({"num_workers": workers})
    assert asked == {"CPU": cpus, "GPU": 0.5}


def test_asha_stops_trials_as_the_recorded_description_says(
    fake_tune: FakeTune, tmp_path: Path
) -> None:
    """The scheduler Tune runs behaves as best_config.json's ``search.scheduler`` says:
    rungs counted in reports, a trial stopped from its first report when it falls out of
    the top half, done after max_t reports."""
    settings = _settings(tmp_path)
    tuner.run_tune(JOB, SPACE, settings, _cluster(), _ignore)
    assert JOB.segment.reports == 3
    assert tuner.scheduler_description(JOB) == ("ASHA(max_t=3, grace_period=1, reduction_factor=2)")
    tune_config = fake_tune.made[0]["tune_config"]
    asha = tune_config.scheduler
    asha.set_search_properties(tune_config.metric, tune_config.mode)  # as Tune does

    def report(trial_id: str, reports: int, util: float) -> str:
        trial = SimpleNamespace(trial_id=trial_id)
        if reports == 1:
            asha.on_trial_add(None, trial)
        return asha.on_trial_result(None, trial, {"training_iteration": reports, "util": util})

    assert tune_config.metric == "util" and tune_config.mode == "max"
    assert report("a", 1, 0.9) == TrialScheduler.CONTINUE
    assert report("b", 1, 0.1) == TrialScheduler.STOP  # grace period 1: at its first report
    assert report("c", 1, 0.6) == TrialScheduler.CONTINUE  # top half (factor 3 would stop it)
    assert report("a", 2, 0.9) == TrialScheduler.CONTINUE
    assert report("a", 3, 0.9) == TrialScheduler.STOP  # max_t: done after 3 reports


def test_tune_gets_the_searcher_the_concurrency_and_no_retries(
    fake_tune: FakeTune, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, num_samples=7, max_concurrent=2)
    tuner.run_tune(JOB, SPACE, settings, _cluster(), _ignore)
    made = fake_tune.made[0]
    tune_config, run_config = made["tune_config"], made["run_config"]
    assert (tune_config.num_samples, tune_config.max_concurrent_trials) == (7, 2)
    assert type(tune_config.search_alg).__name__ == "LoaderSearcher"
    assert tune_config.reuse_actors  # a trial reuses the last one's process
    assert (run_config.name, run_config.storage_path) == ("search-test", str(tmp_path))
    assert run_config.failure_config.max_failures == 0  # a failed trial is a result


def test_a_resumed_search_restores_the_saved_experiment(
    fake_tune: FakeTune, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, resume=True)
    tuner.run_tune(JOB, SPACE, settings, _cluster(), _ignore)
    assert fake_tune.restored == [f"{tmp_path}/search-test"]


def test_trials_come_back_typed_in_completion_order(fake_tune: FakeTune, tmp_path: Path) -> None:
    fake_tune.results = [
        _finished("late", 2.0),
        _finished("early", 1.0, error=RuntimeError("Traceback ...\nValueError: sample 3")),
    ]
    run = tuner.run_tune(JOB, SPACE, _settings(tmp_path, num_samples=2), _cluster(), _ignore)
    assert [(r.trial_id, r.status) for r in run.records] == [("early", "error"), ("late", "ok")]
    assert run.records[0].reason == "RuntimeError: ValueError: sample 3"
    assert run.records[1].config == LoaderConfig(16)  # the space's fixed batch size added
    assert not run.interrupted


def test_ctrl_c_during_the_run_is_an_interrupt(fake_tune: FakeTune, tmp_path: Path) -> None:
    """Tune's handler, on Ctrl-C, ends the run and puts back the handler it found: ours."""
    before = signal.getsignal(signal.SIGINT)

    def tune_s_handler_catches_ctrl_c() -> None:
        found = signal.signal(signal.SIGINT, _tune_s_handler)
        signal.signal(signal.SIGINT, found)  # the run ended on Ctrl-C, the state saved

    fake_tune.during_fit = tune_s_handler_catches_ctrl_c
    run = tuner.run_tune(JOB, SPACE, _settings(tmp_path), _cluster(), _ignore)
    assert run.interrupted
    assert signal.getsignal(signal.SIGINT) is before


def test_a_run_that_ends_by_itself_is_not_an_interrupt(fake_tune: FakeTune, tmp_path: Path) -> None:
    """Tune leaves its own handler installed after a normal end; ours come back after."""
    before = signal.getsignal(signal.SIGINT)
    run = tuner.run_tune(JOB, SPACE, _settings(tmp_path), _cluster(), _ignore)
    assert not run.interrupted
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C in verification interrupts


def test_without_tune_s_handler_only_unfinished_trials_mean_an_interrupt(
    fake_tune: FakeTune, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNE_DISABLE_SIGINT_HANDLER", "1")
    fake_tune.during_fit = lambda: None  # so ours is still installed after the run
    assert not tuner.run_tune(JOB, SPACE, _settings(tmp_path), _cluster(), _ignore).interrupted
    fake_tune.results = [SimpleNamespace(**{**vars(_finished("t1", 1.0)), "metrics": {}})]
    assert tuner.run_tune(JOB, SPACE, _settings(tmp_path), _cluster(), _ignore).interrupted


def test_a_second_ctrl_c_interrupts_at_once(fake_tune: FakeTune, tmp_path: Path) -> None:
    """Tune handles the first Ctrl-C; the second reaches our handler, which raises."""
    before = signal.getsignal(signal.SIGINT)

    def second_ctrl_c() -> None:
        ours = signal.getsignal(signal.SIGINT)  # Tune's, after the first, put ours back
        assert callable(ours)
        ours(signal.SIGINT, None)

    fake_tune.during_fit = second_ctrl_c
    with pytest.raises(KeyboardInterrupt):
        tuner.run_tune(JOB, SPACE, _settings(tmp_path), _cluster(), _ignore)
    assert signal.getsignal(signal.SIGINT) is before


def test_on_ctrl_c_tune_s_own_lines_give_way_to_one_of_the_command_s(
    fake_tune: FakeTune, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    """On Ctrl-C Tune's run loop logs a timestamped notice that it is stopping and how
    to resume with ``Tuner.restore``, and the analysis warns over several lines that
    the trial cut short has no metrics. The command says the first in a line of its
    own, resumes with --resume (its last line says so) and lists the trial in
    trials.csv; any other line passes, the analysis's warning too on a run that was not
    stopped, and after the run the loggers pass everything."""
    import inspect
    import logging

    from ray.tune import tune as tune_loop
    from ray.tune.analysis import experiment_analysis as analysis

    assert tune_loop.logger.name == ray_logs.TUNE_RUN_LOGGER  # the loggers that say them
    assert analysis.logger.name == ray_logs.ANALYSIS_LOGGER
    said = inspect.getsource(tune_loop)  # and how they say them
    assert 'Tuner.restore(path="{path}"' in said and "with: {restore_entrypoint}" in said
    assert ray_logs.STOP_NOTICE in said
    assert ray_logs.NO_METRICS in inspect.getsource(analysis)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    restore = 'Experiment has been interrupted...\nResume experiment with: Tuner.restore(path="x")'
    no_metrics = "Failed to fetch metrics for 1 trial(s):\n- trial_fn_1: FileNotFoundError()"

    def interrupted() -> None:
        tune_loop.logger.warning("Stop signal received (e.g. via SIGINT/Ctrl+C), ending")
        tune_loop.logger.warning("another line of the run loop")
        tune_loop.logger.warning(restore)
        analysis.logger.warning(no_metrics)

    for logger in (tune_loop.logger, analysis.logger):
        logger.addHandler(handler)
    try:
        fake_tune.during_fit = lambda: analysis.logger.warning(no_metrics)  # not stopped
        tuner.run_tune(JOB, SPACE, _settings(tmp_path), _cluster(), _ignore)
        assert seen == [no_metrics] and capfd.readouterr().err == ""
        seen.clear()
        fake_tune.during_fit = interrupted
        tuner.run_tune(JOB, SPACE, _settings(tmp_path / "2"), _cluster(), _ignore)
        assert seen == ["another line of the run loop"]
        assert capfd.readouterr().err == ray_logs.STOP_SAID + "\n"
        seen.clear()  # resumed: the trial the stop cut short has no results either
        fake_tune.during_fit = lambda: analysis.logger.warning(no_metrics)
        tuner.run_tune(JOB, SPACE, _settings(tmp_path / "2", resume=True), _cluster(), _ignore)
        assert seen == [] and capfd.readouterr().err == ""
        tune_loop.logger.warning(restore)  # outside the run: not ours to leave out
        analysis.logger.warning(no_metrics)
        assert seen[-2:] == [restore, no_metrics]
    finally:
        for logger in (tune_loop.logger, analysis.logger):
            logger.removeHandler(handler)


@pytest.mark.parametrize(
    ("mode", "said"),
    [("token", "token in ~/.ray/auth_token"), ("disabled", "no token needed"),
     ("off", "no token needed"), (None, "no token needed")],
)  # fmt: skip
def test_the_dashboard_line_says_where_its_token_is_or_that_it_needs_none(
    mode: str | None, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once Ray has started, its token authentication is on where RAY_AUTH_MODE is
    ``token`` (Ray sets it so for the instance it starts); any other value turns it off,
    and so does none on joining an address. A user who has it off is not sent to look
    for a token (test_dashboard.py checks that the search's own Ray asks for one)."""
    from raytune_loader.tuning import setup

    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    lines: list[str] = []
    progress = SimpleNamespace(stage=lines.append, warn=lines.append)
    cluster = SimpleNamespace(joined=False, dashboard_url="http://127.0.0.1:8265")
    setup.announce_dashboard(cluster, progress)  # type: ignore[arg-type]
    assert lines == [f"Ray dashboard: http://127.0.0.1:8265 ({said})"]


@pytest.mark.parametrize(
    ("mode", "who"),
    [(None, "anyone who can reach it and has the token in ~/.ray/auth_token can run code"),
     ("disabled", "anyone who can reach it can run code on this machine (RAY_AUTH_MODE")],
)  # fmt: skip
def test_a_dashboard_others_can_reach_is_warned_of_with_or_without_its_token(
    mode: str | None, who: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before Ray starts: unset, Ray turns the token on; turned off, anyone who reaches
    the dashboard runs code, and the warning says that."""
    from raytune_loader import SearchOptions
    from raytune_loader.tuning import setup

    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    warned: list[str] = []
    progress = SimpleNamespace(stage=lambda *a, **k: None, warn=warned.append,
                               count=lambda *a, **k: None)  # fmt: skip
    opts = SearchOptions(dashboard_host="0.0.0.0", expose_dashboard=True,
                         out=str(tmp_path / "out"))  # fmt: skip
    setup.checked(opts, progress)  # type: ignore[arg-type]
    (said,) = [w for w in warned if "listens on 0.0.0.0" in w]
    assert who in said


def test_ray_s_warning_on_how_to_turn_its_token_off_is_left_out_where_ray_starts() -> None:
    """Ray's own warning, from its own code, inside the filter start_ray puts around
    ``ray.init``: left out; its warning that authentication is off still passes."""
    import logging

    from ray._private.authentication import authentication_token_setup as setup_logs

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    setup_logs.logger.addHandler(handler)
    try:
        with ray_logs.filtered(ray_logs.AUTH_SETUP_LOGGER, ray_logs.AUTH_ON_WARNING):
            setup_logs._warn_token_auth_enabled()
            setup_logs._warn_token_auth_disabled()
        assert len(seen) == 1 and "Token authentication is disabled" in seen[0]
        setup_logs._warn_token_auth_enabled()  # outside: not ours to leave out
        assert ray_logs.AUTH_ON_WARNING in seen[-1]
    finally:
        setup_logs.logger.removeHandler(handler)


@pytest.mark.parametrize(
    ("pointer", "said"),
    [(None, "no interrupted search under"), ("{cut", "does not say which search to resume"),
     ('["a", "list"]', "does not say which search to resume")],
)  # fmt: skip
def test_resume_with_no_search_to_continue_says_why_and_starts_a_new_one(
    pointer: str | None, said: str, tmp_path: Path
) -> None:
    """--resume where no search was interrupted, or where last_search.json is not the
    record a search writes: one warning saying which, and a new search recorded."""
    import json

    from raytune_loader import SearchOptions
    from raytune_loader.tuning import setup

    out = tmp_path / "out"
    out.mkdir()
    if pointer is not None:
        (out / setup.RESUME_POINTER).write_text(pointer)
    warned: list[str] = []
    cluster = SimpleNamespace(joined=False, nodes=1)
    name, _, resume = setup.experiment(
        out, SearchOptions(resume=True), cluster, SimpleNamespace(warn=warned.append)
    )  # type: ignore[arg-type]
    assert not resume and name.startswith("search-")
    assert len(warned) == 1 and said in warned[0], warned
    assert warned[0].endswith("; starting a new one")
    assert json.loads((out / setup.RESUME_POINTER).read_text())["name"] == name


def test_only_a_saved_experiment_can_be_resumed(searched: Searched) -> None:
    storage = searched.folder / "tune"
    (experiment,) = storage.glob("search-*")
    assert tuner.can_resume(str(storage), experiment.name)
    assert tuner.can_resume(f"{storage}/", experiment.name)
    assert not tuner.can_resume(str(storage), "search-never-run")


def _pid() -> int:
    return os.getpid()


def _niceness() -> int:
    return os.nice(0)


def _idle_workers(before: set[int]) -> set[int]:
    """The idle worker processes (``ray::IDLE``, or not yet titled) of the raylets this
    test process started since ``before``."""
    workers = set()
    for raylet in ray_processes() - before:
        try:
            if "raylet/raylet" not in " ".join(psutil.Process(raylet).cmdline()):
                continue
            for child in psutil.Process(raylet).children():
                line = " ".join(child.cmdline())
                if "default_worker.py" in line or line.startswith("ray::IDLE"):
                    workers.add(child.pid)
        except psutil.Error:
            continue  # ended meanwhile
    return workers


@pytest.mark.slow
def test_our_ray_keeps_the_measuring_worker_while_trials_hold_every_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker that measured the ceiling (torch imported) is the one verification
    reuses: Ray's default ends a worker idle for 1 s while trials hold the node's CPUs,
    and the next measurement then starts a process and imports torch again. And it
    measures at the priority a training job runs at, the driver's: Ray's default puts
    its workers at niceness 15, below anything else on the machine. No worker starts
    before a task asks: Ray's default starts one per CPU, which no task of a search
    could run on (they carry no runtime_env)."""
    before = ray_processes()
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # Ray's workers import _pid from here
    tuner.start_ray(None, "127.0.0.1", num_cpus=2, verbose=False)
    try:
        assert _idle_workers(before) == set()  # ray.init waits for those it prestarts
        assert ray.get(ray.remote(num_cpus=1)(_niceness).remote()) == os.nice(0)
        measure = ray.remote(num_cpus=1)(_pid)
        first = ray.get(measure.remote())

        @ray.remote(num_cpus=2, runtime_env={"env_vars": {"A_TRIAL": "1"}})  # its own process
        class Trial:
            def pid(self) -> int:
                return os.getpid()

        trial = Trial.remote()
        assert ray.get(trial.pid.remote()) != first
        time.sleep(3)  # past the 1 s idle limit, checked every 0.2 s, every CPU held
        ray.kill(trial)
        assert ray.get(measure.remote()) == first
    finally:
        tuner.stop_ray()
    assert ray_processes() <= before


def test_a_ray_data_trial_asks_tune_for_its_bundle_and_its_actors_packed() -> None:
    """Its own bundle first (Tune runs the trainable there), then one per actor of the
    pool at its largest, pinned to the CPU nodes when they are named."""
    from dataclasses import replace

    from raytune_loader.raydata.config import RayDataConfig
    from raytune_loader.raydata.reservation import PIN_SHARE

    cluster = replace(_cluster("gpu-node"), cpu_node_type="cpu-node", remote_cpus=8.0)
    candidate = RayDataConfig(8, 1, 3, cpus_per_actor=2.0).candidate()
    asked = wrap_function(tuner.trainable(JOB, 0.5, cluster)).default_resource_request(
        {**candidate.values(), "predicted_samples_per_s": 1.0}
    )
    assert asked.strategy == "PACK"
    assert asked.bundles == [
        {"CPU": 1.0, "GPU": 0.5, "gpu-node": tuner.NODE_TYPE_SHARE},
        *[{"CPU": 2.0, "cpu-node": PIN_SHARE}] * 3,
    ]
