"""The search's progress display: plain lines in a log, counters redrawn on a terminal;
the command lines' exit."""

from __future__ import annotations

import gc
import importlib.util
import io
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from raytune_loader.outputs.console import TerminalProgress
from raytune_loader.tuning.tuner import TrialEvent
from records_for_tests import record

BASELINE = {"num_workers": 0, "batch_size": 32}
TWO_WORKERS = {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": True,
               "batch_size": 32}  # fmt: skip
ONE_WORKER = {"num_workers": 1, "prefetch_factor": 4, "persistent_workers": False,
              "batch_size": 32}  # fmt: skip
TAIL = r" \| \d+s elapsed, ~\d+s left$"


class FakeStream(io.StringIO):
    """A stream that says whether it is a terminal."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def _final(samples_per_s: float, util: float, wait: float, **extra: Any) -> dict[str, Any]:
    return {"final": True, "samples_per_s": samples_per_s, "util": util,
            "data_wait_frac": wait, **extra}  # fmt: skip


def _interim(util: float) -> dict[str, Any]:
    return {"final": False, "samples_per_s": 100.0, "util": util, "data_wait_frac": 0.5}


def feed_search(progress: TerminalProgress) -> None:
    """A whole search as Tune reports it: five trials that end five different ways."""
    progress.stage("Searching 5 configurations of small-cnn on synthetic-imagenet")
    progress.warn("--max-workers 64 is more than the 2 usable CPUs; using 2")
    for done in range(4):
        progress.count("measuring the ceiling", done, 3)
    events = [
        ("result", "t1", BASELINE, _interim(0.3)),
        ("result", "t1", BASELINE, _final(214, 0.38, 0.62)),
        ("complete", "t1", BASELINE, _final(214, 0.38, 0.62)),
        ("result", "t2", ONE_WORKER, _interim(0.2)),
        ("complete", "t2", ONE_WORKER, _interim(0.2)),  # ASHA stopped it: no final result
        ("result", "t3", TWO_WORKERS, _interim(0.7)),
        ("complete", "t3", TWO_WORKERS, _final(301, 0.78, 0.22)),
        ("error", "t4", ONE_WORKER, {}),  # the trial raised
        ("complete", "t5", TWO_WORKERS, _final(0.0, 0.0, 1.0, failure="shm")),  # refused
    ]
    for kind, trial_id, config, metrics in events:
        progress.trial(TrialEvent(kind, trial_id, config, metrics))


EXPECTED = [
    "==> Searching 5 configurations of small-cnn on synthetic-imagenet",
    "warning: --max-workers 64 is more than the 2 usable CPUs; using 2",
    "    measuring the ceiling: 3/3",
    r"[1/5] done: workers=0 pin=n bs=32 214 samples/s util 0.38 wait 0.62"
    r" | best 0.38 (workers=0 pin=n bs=32) | done 1, stopped early 0, failed 0",
    r"[2/5] stopped early: workers=1 prefetch=4 pin=n persistent=n bs=32"
    r" 100 samples/s util 0.20 wait 0.50"
    r" | best 0.38 (workers=0 pin=n bs=32) | done 1, stopped early 1, failed 0",
    r"[3/5] done: workers=2 prefetch=2 pin=n persistent=y bs=32 301 samples/s util 0.78 wait 0.22"
    r" | best 0.78 (workers=2 prefetch=2 pin=n persistent=y bs=32)"
    r" | done 2, stopped early 1, failed 0",
    r"[4/5] error: workers=1 prefetch=4 pin=n persistent=n bs=32"
    r" | best 0.78 (workers=2 prefetch=2 pin=n persistent=y bs=32)"
    r" | done 2, stopped early 1, failed 1",
    r"[5/5] failed (shm): workers=2 prefetch=2 pin=n persistent=y bs=32"
    r" | best 0.78 (workers=2 prefetch=2 pin=n persistent=y bs=32)"
    r" | done 2, stopped early 1, failed 2",
]


def rendered(text: str) -> list[str]:
    """What a terminal shows: ``\\r`` goes back to column 0, ``\\033[K`` erases the rest."""
    return [line.split("\r")[-1].replace("\033[K", "") for line in text.split("\n")][:-1]


def _assert_shows(lines: list[str], expected: list[str]) -> None:
    assert len(lines) == len(expected), lines
    for line, want in zip(lines, expected, strict=True):
        if want.startswith("["):  # trial lines end with the (time-dependent) elapsed and ETA
            assert re.fullmatch(re.escape(want) + TAIL, line), f"{line!r} != {want!r}"
        else:
            assert line == want


def test_plain_stream_gets_plain_lines_and_the_counts() -> None:
    stream = FakeStream(tty=False)
    progress = TerminalProgress(5, "util", stream)
    feed_search(progress)
    text = stream.getvalue()
    assert "\r" not in text and "\033" not in text
    lines = text.splitlines()
    ceiling = [line for line in lines if "measuring the ceiling" in line]
    assert (
        ceiling[-1] == "    measuring the ceiling: 3/3" and len(ceiling) == 4
    )  # 3 steps: one line each
    _assert_shows([line for line in lines if line not in ceiling[:-1]], EXPECTED)
    assert progress.done == {"t1": "done", "t2": "stopped early", "t3": "done",
                             "t4": "error", "t5": "failed (shm)"}  # fmt: skip
    assert progress.best == (0.78, "workers=2 prefetch=2 pin=n persistent=y bs=32")
    assert progress.running == set()


def test_terminal_redraws_counters_in_place() -> None:
    stream = FakeStream(tty=True)
    progress = TerminalProgress(5, "util", stream)
    feed_search(progress)
    text = stream.getvalue()
    # every write starts by returning to column 0 and erasing the line
    assert text.count("\r\033[K") == 2 + 4 + 5  # stage + warn, 4 counter draws, 5 trial lines
    assert "    measuring the ceiling: 0/3\r\033[K    measuring the ceiling: 1/3" in text
    _assert_shows(rendered(text), EXPECTED)  # only the finished counter stays on screen


def test_a_trial_above_the_first_ceiling_is_explained_once() -> None:
    """On a CPU util is the rate over the ceiling measured before the search: a trial
    above it gets one line saying why, the next one none; NVML's util never does."""
    stream = FakeStream(tty=False)
    progress = TerminalProgress(4, "util", stream)
    cpu = {"util_source": "step-timing", "ceiling_samples_per_s": 440.0}
    gpu = {**cpu, "util_source": "nvml-process"}
    for trial_id, util, source in [("t1", 0.9, cpu), ("t2", 1.08, cpu), ("t3", 1.15, cpu),
                                   ("t4", 1.2, gpu)]:  # fmt: skip
        metrics = _final(440 * util, util, 0.0, **source)
        progress.trial(TrialEvent("complete", trial_id, TWO_WORKERS, metrics))
    lines = stream.getvalue().splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("    (util above 1")]
    assert said == [2] and lines[1].startswith("[2/4] done:") and len(lines) == 5
    assert "the ceiling measured before the search, 440 samples/s" in lines[2]


def test_an_unfinished_counter_is_overwritten_by_the_next_line() -> None:
    stream = FakeStream(tty=True)
    progress = TerminalProgress(1, "util", stream)
    progress.count("verifying", 1, 3)
    progress.stage("interrupted")
    assert rendered(stream.getvalue()) == ["==> interrupted"]


@pytest.mark.parametrize("total", [1, 3, 7, 100, 1000])
def test_count_on_a_plain_stream_prints_about_every_quarter(total: int) -> None:
    stream = FakeStream(tty=False)
    progress = TerminalProgress(1, "util", stream)
    for done in range(total + 1):
        progress.count("generating JPEG files", done, total)
    lines = stream.getvalue().splitlines()
    assert lines[0] == f"    generating JPEG files: 0/{total}"
    assert lines[-1] == f"    generating JPEG files: {total}/{total}"
    assert len(lines) <= 5
    if total >= 4:
        printed = [int(line.split(": ")[1].split("/")[0]) for line in lines]
        assert printed == [-(-total * q // 4) for q in range(5)]  # first call of each quarter


def test_count_starts_afresh_for_another_counter() -> None:
    stream = FakeStream(tty=False)
    progress = TerminalProgress(1, "util", stream)
    for what in ("measuring the ceiling", "verifying"):
        for done in range(9):
            progress.count(what, done, 8)
    counters = [line.split(":")[0].strip() for line in stream.getvalue().splitlines()]
    assert counters == ["measuring the ceiling"] * 5 + ["verifying"] * 5


def test_the_summary_says_how_the_tuned_pipeline_is_built() -> None:
    from raytune_loader.outputs.console import pipeline_line

    uint8 = {"transfer": "uint8", "decode": "pil", "workers": "process", "in_order": False,
             "start_method": "spawn"}  # fmt: skip
    assert pipeline_line(uint8) == (
        "decoded by PIL in the workers, uint8 transfer (normalized on the device), "
        "process workers, out of order, start method spawn"
    )
    threads = {"transfer": "float32", "decode": "tensor", "workers": "thread",
               "in_order": True, "start_method": "default"}  # fmt: skip
    assert pipeline_line(threads) == (
        "decoded to tensors in the workers, float32 transfer (normalized in the "
        "workers), thread workers, in order"
    )
    device = {**threads, "decode": "device", "transfer": "uint8"}
    assert pipeline_line(device).startswith("decoded on the device (nvJPEG), JPEG bytes")
    bucket = {**uint8, "fetch_threads": 16, "cache": True}
    assert pipeline_line(bucket).endswith(
        "start method spawn, 16 requests in flight per worker, the bucket's objects kept on "
        "the node's disk after the first epoch"
    )


def test_the_summary_says_where_the_limit_is() -> None:
    from raytune_loader.outputs.console import limit_line

    limit = {"bound": "model", "input_samples_per_s": 900.0, "trained_samples_per_s": 300.0,
             "headroom": 2.0, "per_core_samples_per_s": 250.0}  # fmt: skip
    assert limit_line(limit) == (
        "model-bound: the loader has 200% headroom (the input pipeline alone delivers 900 "
        "samples/s, training took 300; one core decodes and augments 250 samples/s)"
    )
    bound = {**limit, "bound": "input", "input_samples_per_s": 310.0, "headroom": 0.03}
    assert limit_line(bound).startswith("input-bound: the input pipeline delivers at most 310")
    assert limit_line(None) is None


class _ExitHandlers:
    """atexit's register and unregister, on a list of handlers."""

    def __init__(self) -> None:
        self.handlers: list[Any] = []

    def register(self, handler: Any) -> None:
        self.handlers.append(handler)

    def unregister(self, handler: Any) -> None:
        self.handlers = [h for h in self.handlers if h != handler]


def test_every_command_line_freezes_its_objects_at_exit_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each main (bad input, exit status 2) leaves one exit handler, gc.freeze, however
    often it runs: the shutdown's garbage collection then skips the heap."""
    from raytune_loader import bench, search
    from raytune_loader.outputs import console, report

    handlers = _ExitHandlers()
    monkeypatch.setattr(console, "atexit", handlers)
    calls = [(search.main, ["--dataset", "no-such-set"]), (bench.main, ["--config", "none.json"]),
             (report.main, ["no-such-folder"])]  # fmt: skip
    assert [main(argv) for main, argv in calls * 2] == [2] * 6
    assert handlers.handlers == [gc.freeze]
    assert len(capsys.readouterr().err.strip().splitlines()) == 6  # one line each


def test_every_experiment_the_gpu_check_runs_freezes_its_objects_at_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GPU check's stages that are experiments end as the command lines do, sooner
    on a lent device's minutes. A bad flag (exit status 2) comes after the handler is
    registered."""
    from raytune_loader.outputs import console

    experiments = REPO / "experiments"
    monkeypatch.syspath_prepend(str(experiments))  # their own imports: _common
    gpu_plan = _load(experiments / "gpu_plan.py", monkeypatch)
    stages = [name for name in gpu_plan.STAGES if (experiments / f"{name}.py").exists()]
    assert len(stages) >= 5  # all but the searches, which run the command line
    handlers = _ExitHandlers()
    monkeypatch.setattr(console, "atexit", handlers)
    for name in stages:
        handlers.handlers.clear()
        monkeypatch.setattr(sys, "argv", [f"{name}.py", "--no-such-flag"])
        with pytest.raises(SystemExit) as exited:
            _load(experiments / f"{name}.py", monkeypatch).main()
        assert exited.value.code == 2
        assert handlers.handlers == [gc.freeze], name


def _load(path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A script of experiments/ (not a package) as a module of its own name, so that
    ``limits`` or ``precision`` is never another package's; gone after the test."""
    spec = importlib.util.spec_from_file_location(f"experiments_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


def test_unsteady_trials_and_figures_beyond_a_bound_are_said() -> None:
    from raytune_loader.outputs.console import notes, steady_lines

    trials = [
        record("a", "ok", steady=True, steady_ratio=1.02),
        record("b", "ok", steady=False, steady_ratio=1.4),
        record("c", "ok", steady=True, samples_per_s=585.0, ceiling_samples_per_s=534.0),
    ]
    said = notes(trials)
    assert any(line.startswith("1 trial(s) measured a window whose halves") for line in said)
    assert any("above the ceiling beyond noise" in line and "585" in line for line in said)
    assert notes(trials[:1]) == []
    best = {
        "metrics": {"steady": False, "refused": ["measured 585 samples/s, above the ceiling"]},
        "baselines": {"heuristic": {"metrics": {"steady": True}}},
    }
    lines = steady_lines(best)
    assert lines[0].startswith("not steady:") and "left out of tuned's figures" in lines[1]
    assert steady_lines({"metrics": {"steady": True}}) == []


@pytest.mark.parametrize(("steal", "said"), [(0.18, True), (0.02, True), (0.019, False),
                                             (None, False)])  # fmt: skip
def test_a_machine_whose_hypervisor_took_its_cpus_is_said_to_be_noisy(
    steal: float | None, said: bool
) -> None:
    from raytune_loader.outputs.console import steady_lines

    lines = steady_lines({"metrics": {"steady": True}, "hardware": {"cpu_steal_frac": steal}})
    assert bool(lines) == said
    if said:
        assert lines[0].startswith(f"noisy machine: its hypervisor gave {steal:.0%} of ")
