"""Ctrl-C in every phase of a real search: exit 130 within seconds, finished trials kept,
no Ray process left, and --resume goes on from each stop and completes the search."""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, TESTS, ray_processes

# real searches: pytest -m slow; alone: each stop must end the search within 10 s
pytestmark = [pytest.mark.slow, pytest.mark.alone]


def _search(data: Path, out: Path, images: int, trials: int, verify_repeats: int) -> list[str]:
    """The command line of a small real search."""
    return [
        sys.executable, "-m", "raytune_loader.search",
        "--data-root", str(data), "--synthetic-images", str(images),
        "--num-samples", str(trials), "--batch-size", "8", "--steps", "12", "--warmup-steps", "1",
        "--report-every", "12", "--samples-per-trial", "64", "--verify-top", "1",
        "--verify-repeats", str(verify_repeats), "--search", "tpe", "--out", str(out),
    ]  # fmt: skip


def _trial_dirs(out: Path) -> list[Path]:
    return sorted((out / "synthetic-imagenet" / "tune").glob("search-*/trial_fn_*"))


def _done(out: Path) -> set[str]:
    """Trials whose last result Tune marked done."""
    done = set()
    for trial in _trial_dirs(out):
        result = trial / "result.json"
        if result.exists() and '"done": true' in result.read_text():
            done.add(trial.name)
    return done


class _Search:
    """A real search in a subprocess whose output lines are read as they come."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}", "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.seen: list[str] = []

    def wait_for(self, text: str, timeout: float = 240) -> None:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        for line in self.process.stdout:  # plain progress lines: stdout is not a terminal
            self.seen.append(line)
            if text in line:
                return
            assert time.monotonic() < deadline, f"no {text!r} in time"
        raise AssertionError(f"the search ended before {text!r}: {''.join(self.seen)[-2000:]}")

    def interrupt(self) -> tuple[float, str]:
        """Ctrl-C; (seconds until it exited, stderr)."""
        self.process.send_signal(signal.SIGINT)
        started = time.monotonic()
        try:
            _, stderr = self.process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()  # it ignored Ctrl-C: the test fails, the search ends
            raise
        return time.monotonic() - started, stderr


# Each phase, recognised by what the command prints when it starts, in the order one
# search reaches them.
PHASES = {
    "data preparation": "==> Synthetic ImageNet",
    "ceiling": "measuring the ceiling",
    "the last trial": "[1/2]",  # two trials: the first has ended, the last runs
    "verification": "verifying",
}


@dataclass(frozen=True)
class Stop:
    """What one Ctrl-C left."""

    seconds: float  # from SIGINT to the exit
    returncode: int
    stderr: str
    best_config_written: bool
    ray_left: set[int]  # Ray daemons that were not running before the search
    finished: set[str]  # trials Tune marked done
    statuses: list[str] | None  # trials.partial.csv's; None where it was not written


@dataclass(frozen=True)
class Chain:
    stops: dict[str, Stop]
    resumed: subprocess.CompletedProcess[str]  # the last --resume, left to finish
    folder: Path  # results/synthetic-imagenet
    out: Path
    ray_before: set[int]


@contextlib.contextmanager
def _ctrl_c_reaches_the_searches() -> Iterator[None]:
    """Run from a background shell (``pytest ... &``), this process ignores Ctrl-C and
    its searches would inherit that and finish instead of stopping. A user's terminal
    gives them the default: so does this, while it lasts."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # SIG_DFL after exec
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Chain:
    """One search Ctrl-C'd in each phase in turn, each time continued with --resume,
    then resumed once more to its end: every phase is stopped and every stop is resumed
    from, in one search's worth of starts. The data is generated afresh and is large
    enough for its preparation to be caught."""
    tmp = tmp_path_factory.mktemp("resume")
    with _ctrl_c_reaches_the_searches():
        before = ray_processes()
        out = tmp / "results"
        folder = out / "synthetic-imagenet"
        args = _search(tmp / "fresh", out, images=600, trials=2, verify_repeats=1)
        stops = {}
        for n, (phase, text) in enumerate(PHASES.items()):
            search = _Search([*args, "--resume"] if n else args, tmp)
            try:
                search.wait_for(text)
            finally:  # also when the phase never came: the search stops as a user would stop it
                seconds, stderr = search.interrupt()
            statuses = None
            if (folder / "trials.partial.csv").exists():
                with open(folder / "trials.partial.csv") as handle:
                    statuses = [row["status"] for row in csv.DictReader(handle)]
            stops[phase] = Stop(
                seconds, search.process.returncode, stderr, (folder / "best_config.json").exists(),
                ray_processes() - before, _done(out), statuses,
            )  # fmt: skip
        resumed = subprocess.run(
            [*args, "--resume"], cwd=tmp, capture_output=True, text=True, timeout=400,
            env={**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}"},
        )  # fmt: skip
    return Chain(stops, resumed, folder, out, before)


@pytest.mark.parametrize("phase", PHASES)
def test_ctrl_c_in_every_phase_stops_within_10_s_and_says_how_to_resume(
    phase: str, chain: Chain
) -> None:
    stop = chain.stops[phase]
    assert stop.returncode == 130, stop.stderr[-2000:]
    assert stop.seconds < 10, f"Ctrl-C took {stop.seconds:.1f}s"
    assert "--resume" in stop.stderr.strip().splitlines()[-1]
    assert "Traceback" not in stop.stderr
    # Tune's notice and its analysis's warning over lines: said in the command's words
    assert "Stop signal received" not in stop.stderr and "Failed to fetch" not in stop.stderr
    if phase == "the last trial":  # Tune's loop took the Ctrl-C
        assert "Ctrl-C: ending the search" in stop.stderr, stop.stderr[-2000:]
    assert not stop.best_config_written
    assert not stop.ray_left  # no Ray daemon left behind


def test_a_stop_in_the_last_trial_keeps_the_first_and_a_stop_in_verification_both(
    chain: Chain,
) -> None:
    """Before the trials nothing is finished; in the last trial the first is kept and the
    interrupted one is not taken for finished; in verification both are kept."""
    assert chain.stops["data preparation"].finished == chain.stops["ceiling"].finished == set()
    last = chain.stops["the last trial"]
    assert len(last.finished) == 1
    assert last.statuses is not None  # the trials so far are kept in trials.partial.csv
    assert "interrupted" in last.statuses or len(last.statuses) < 2
    assert len(chain.stops["verification"].finished) == 2


def test_resume_after_every_stop_finishes_the_search_without_losing_a_trial(
    chain: Chain,
) -> None:
    assert chain.resumed.returncode == 0, chain.resumed.stderr[-3000:]
    with open(chain.folder / "trials.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and all(r["status"] in ("ok", "stopped_early") for r in rows)
    for stop in chain.stops.values():
        assert stop.finished <= _done(chain.out)  # nothing finished was lost or re-run anew
    assert len(_trial_dirs(chain.out)) == 2  # the total asked for, no more
    assert (chain.folder / "best_config.json").exists()
    assert (chain.folder / "report.md").exists()
    assert not (chain.folder / "trials.partial.csv").exists()
    # the Optuna study on disk holds the trials from before every stop, as trials.csv does
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(chain.folder / "study.journal")))
    (study,) = optuna.get_all_study_summaries(storage)
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    assert sorted(t.user_attrs["trial_id"] for t in trials) == sorted(r["trial_id"] for r in rows)
    assert ray_processes() <= chain.ray_before
