"""Tests side by side (pytest-xdist), and the tests that need the machine alone.

Most of the tests wait: for a search's Ray to start, for a process to import torch,
for a subprocess to end. pyproject.toml runs them in three xdist workers, so that
one's waits are another's compute. A test that measures speed, waits or CPU time
(``@pytest.mark.alone``) would measure its neighbours too: the alone tests run
first, one after another in one worker, while the other workers wait; only then do
the rest start, side by side. Without xdist (``-n 0``) the alone tests simply run
first. The session's search (the fast tier's longest wait) starts first among the
rest, and a worker that runs any other test lowers its priority (niceness 10), so
that the search, the critical path, is not slowed by its neighbours.

:class:`AloneFirst` hands the workers their tests in units: the alone tests; the
tests that read the session's search (the ``searched`` fixture), so that it runs
once; the tests of a module whose fixture they share, so that it runs once; every
other test on its own. The tests marked ``long`` start first among the rest. (xdist's
own ``--dist loadgroup`` does not group on pytest 9.2, which no longer reads the
node id it rewrites: github.com/pytest-dev/pytest-xdist/issues/1386.)
A worker's Ray daemons carry its :data:`TAG` in their environment, so that a test
asking which Ray processes are left sees its own worker's, not a neighbour's. Side by
side, the workers' torch threads sleep when idle rather than spin
(``OMP_WAIT_POLICY=PASSIVE``): they would take the cores their neighbours need.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from xdist.scheduler import LoadScopeScheduling

ALONE = "alone"
LONG = "long"  # minutes: started first among the rest, so as not to end the run alone
SEARCHED = "searched"  # the session fixture of the fast tier's search
TAG = "RAYTUNE_LOADER_TEST_WORKER"  # inherited by every process a test starts
RUN = "RAYTUNE_LOADER_TEST_RUN"  # the controller's, for its workers' shared board
POLL_S = 0.5
NICE = 10  # a worker's niceness once it runs other tests than the session's search
_ALONE_COUNT = pytest.StashKey[int]()
_NICE = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    os.environ[TAG] = f"{worker or 'main'}-{os.getpid()}"
    if worker is None:  # the controller (or the only process): before any worker starts
        os.environ[RUN] = uuid.uuid4().hex
        if getattr(config.option, "numprocesses", None):
            _ensure_ray_token()
            # Every worker, and every process a test starts, inherits this; OpenMP reads
            # it when torch loads. Its threads then sleep once their share of an op is
            # done instead of spinning: side by side on 2 cores, the slower of two
            # small-CNN loops took 9.0 s with the default against 3.1 s, though one
            # alone took 3.1 s against 2.2 s (results/benchmarks/omp_wait.json). The
            # workers import torch only once they collect. One process (-n 0) keeps
            # OpenMP's default; a search's trials train on one thread either way.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_unconfigure(config: pytest.Config) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        shutil.rmtree(_board(create=False), ignore_errors=True)


def _ensure_ray_token() -> None:
    """Ray writes ``~/.ray/auth_token`` when its first local instance starts and finds
    none: two workers' first searches at once would each write their own, and one
    instance would then refuse the token on file. Written once, before the workers."""
    ray = shutil.which("ray")
    if ray is not None and not (Path.home() / ".ray" / "auth_token").exists():
        subprocess.run([ray, "get-auth-token", "--generate"], capture_output=True, check=False)


def _board(create: bool = True) -> Path:
    """The folder this test run's processes share: the units, the alone tests done."""
    board = Path(tempfile.gettempdir()) / f"raytune-loader-tests-{os.environ[RUN]}"
    if create:
        board.mkdir(exist_ok=True)
    return board


def _parallel() -> bool:
    """Whether this process is one of several xdist workers."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1


def _alone(item: pytest.Item) -> bool:
    return item.get_closest_marker(ALONE) is not None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The alone tests first, then the search's readers and the long tests (stable)."""
    items.sort(key=lambda item: (
        not _alone(item),
        SEARCHED not in item.fixturenames and item.get_closest_marker(LONG) is None,
    ))  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before the worker tells the controller it has collected
def pytest_collection_finish(session: pytest.Session) -> None:
    """Count the alone tests; a worker writes each test's unit for the scheduler."""
    session.config.stash[_ALONE_COUNT] = sum(map(_alone, session.items))
    if "PYTEST_XDIST_WORKER" in os.environ:
        units = {item.nodeid: _unit(item) for item in session.items}
        path = _board() / "units.json"
        mine = path.with_suffix(f".{os.getpid()}")  # the workers collect alike; one wins
        mine.write_text(json.dumps(units))
        mine.replace(path)


def _unit(item: pytest.Item) -> str:
    """What goes to one worker with ``item``: the alone tests together, the search's
    readers together, the tests of a module fixture's module together; else itself."""
    if _alone(item):
        return ALONE
    if SEARCHED in item.fixturenames:
        return SEARCHED
    info = getattr(item, "_fixtureinfo", None)  # pytest's: which fixtures, of what scope
    defs = info.name2fixturedefs.values() if info is not None else ()
    if info is None or any(d[-1].scope in ("module", "class", "package") for d in defs):
        return item.nodeid.split("::", 1)[0]
    return item.nodeid


class AloneFirst(LoadScopeScheduling):
    """Units (:func:`_unit`) in collection order: the alone tests, then the others."""

    def schedule(self) -> None:
        if self.collection is None and self.collection_is_completed:
            path = _board() / "units.json"
            self.units: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        super().schedule()

    def _split_scope(self, nodeid: str) -> str:
        return getattr(self, "units", {}).get(nodeid) or nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> AloneFirst:
    config.option.loadscopereorder = False  # the alone tests' unit first
    return AloneFirst(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """An alone test runs, then says so; any other waits until all of them have."""
    if not _parallel():
        yield
        return
    board = _board()
    if _alone(item):
        (board / "runner").write_text(str(os.getpid()))
        yield
        (board / f"done-{uuid.uuid4().hex}").touch()
        return
    _wait_for_the_alone_tests(board, item.config.stash[_ALONE_COUNT])
    if SEARCHED not in item.fixturenames and not item.config.stash.get(_NICE, False):
        os.nice(NICE)  # the session's search, the longest wait, goes first on the CPUs
        item.config.stash[_NICE] = True
    yield


def _wait_for_the_alone_tests(board: Path, count: int) -> None:
    while len(list(board.glob("done-*"))) < count:
        runner = board / "runner"
        if runner.exists() and not psutil.pid_exists(int(runner.read_text() or 0)):
            return  # their worker crashed: xdist reports it, the rest goes on
        time.sleep(POLL_S)
