"""Ctrl-C in every phase of a real search: exit 130 within seconds, finished trials kept,
no Ray process left, and --resume completes the search."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, TESTS, ray_processes

pytestmark = pytest.mark.slow  # real searches: pytest -m slow


def _search(data: Path, out: Path, trials: int, verify_repeats: int) -> list[str]:
    """The command line of a small real search."""
    return [
        sys.executable, "-m", "raytune_loader.search",
        "--data-root", str(data), "--synthetic-images", "96",
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
        _, stderr = self.process.communicate(timeout=120)
        return time.monotonic() - started, stderr


# Each phase, recognised by what the command prints when it starts.
PHASES = {
    "data preparation": "==> Synthetic ImageNet",
    "ceiling": "measuring the ceiling",
    "the last trial": "[1/2]",  # two trials: the first has ended, the last runs
    "verification": "verifying",
}


@pytest.mark.parametrize("phase", PHASES)
def test_ctrl_c_in_every_phase_stops_within_10_s_and_resume_finishes(
    phase: str, tiny_imagenet: Path, tmp_path: Path
) -> None:
    before = ray_processes()
    out = tmp_path / "results"
    data = tmp_path / "fresh" if phase == "data preparation" else tiny_imagenet
    images = "600" if phase == "data preparation" else "96"  # long enough to be caught
    args = [*_search(data, out, trials=2, verify_repeats=1), "--synthetic-images", images]
    search = _Search(args, tmp_path)
    search.wait_for(PHASES[phase])
    seconds, stderr = search.interrupt()
    assert search.process.returncode == 130, stderr[-2000:]
    assert seconds < 10, f"Ctrl-C took {seconds:.1f}s"
    assert "--resume" in stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr
    folder = out / "synthetic-imagenet"
    assert not (folder / "best_config.json").exists()
    assert ray_processes() <= before  # no Ray daemon left behind
    finished_before = _done(out)
    if phase == "the last trial":
        with open(folder / "trials.partial.csv") as handle:
            statuses = [row["status"] for row in csv.DictReader(handle)]
        assert "interrupted" in statuses or len(statuses) < 2  # not taken for a finished search
        assert len(finished_before) == 1
    if phase == "ceiling":
        return  # resumed, it starts afresh, as after data preparation

    resumed = subprocess.run(
        [*args, "--resume"], cwd=tmp_path, capture_output=True, text=True, timeout=400,
        env={**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}"},
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with open(folder / "trials.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and all(r["status"] in ("ok", "stopped_early") for r in rows)
    assert finished_before <= _done(out)  # nothing finished was lost or re-run anew
    assert len(_trial_dirs(out)) == 2  # the total asked for, no more
    assert (folder / "best_config.json").exists() and (folder / "report.md").exists()
    assert not (folder / "trials.partial.csv").exists()
    assert ray_processes() <= before
