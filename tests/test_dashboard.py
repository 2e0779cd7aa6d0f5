"""A real search with two data-parallel ranks per trial, run once and watched through
its Ray dashboard while it runs.

The dashboard is token-protected: Ray 2.60 turns on token authentication (the token is
in ``~/.ray/auth_token``; its HTTP middleware reads ``Authorization: Bearer <token>``,
answering 401 without a token and 403 with a wrong one), and it shows the trial
actors (Tune runs each trial of the function trainable as an actor of class
``ImplicitFunc``). The search's own results show both ranks of every trial training
at once on this node, within its CPUs, against the three baselines.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, TESTS, ray_processes

pytestmark = [pytest.mark.slow, pytest.mark.long]  # real searches: pytest -m slow

DASHBOARD = re.compile(r"^==> Ray dashboard: (http://127\.0\.0\.1:\d+) \(")
TRIAL_ACTOR = "ImplicitFunc"  # Tune's wrapper class of a function trainable (trial_fn)


class _Search:
    """``python -m raytune_loader.search`` in a subprocess, its output read by a thread."""

    def __init__(self, *args: str, cwd: Path) -> None:
        env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}"}
        env["RAY_ADDRESS"] = "local"  # our own Ray, never a `ray start` cluster already running
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            env.pop(name, None)  # Ray's defaults: token auth, token in ~/.ray/auth_token
        self.process = subprocess.Popen(
            [sys.executable, "-m", "raytune_loader.search", *args],
            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.url: str | None = None
        self.dashboard_seen = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            match = DASHBOARD.match(line)
            if match and self.url is None:
                self.url = match.group(1)
                self.dashboard_seen.set()
        self.dashboard_seen.set()  # the search ended; don't keep the test waiting

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        """Ctrl-C if still running (the search then shuts Ray down), kill as a last resort."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=10)


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _actors(url: str, token: str) -> list[dict[str, Any]]:
    status, body = _get(f"{url}/api/v0/actors?detail=true&limit=1000", token)
    assert status == 200, body[:300]
    return json.loads(body)["data"]["result"]["result"]


def _wait_for_trial_actor(url: str, token: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = _actors(url, token)
        trials = [actor for actor in seen if TRIAL_ACTOR in actor["class_name"]]
        if trials:
            return trials[0]
        time.sleep(1)
    raise AssertionError(f"no {TRIAL_ACTOR} actor within {timeout:.0f}s; actors: {seen}")


def _session_processes(session: str) -> list[str]:
    out = subprocess.run(["pgrep", "-u", str(os.getuid()), "-af", session],
                         capture_output=True, text=True)  # fmt: skip
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def _left_behind(before: set[int], session: str, timeout: float = 20) -> tuple[set[int], list[str]]:
    """Ray processes started since ``before``, and any of this session, once they had time to go."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new, ours = ray_processes() - before, _session_processes(session)
        if not new and not ours:
            break
        time.sleep(0.5)
    return new, ours


@dataclass(frozen=True)
class Watched:
    """What the dashboard answered while the search ran, and what the search left."""

    output: str
    returncode: int
    folder: Path  # <out>/synthetic-imagenet
    statuses: dict[str, int]  # /api/version with the token, without one, with a wrong one
    session: str
    actor: dict[str, Any]  # a trial actor, as the dashboard listed it
    left_behind: tuple[set[int], list[str]]
    page: dict[str, str]  # the dashboard's actors page in Chromium: its text, a screenshot


@pytest.fixture(scope="module")
def watched(tiny_imagenet: Path, tmp_path_factory: pytest.TempPathFactory) -> Watched:
    from conftest import TINY_SEARCH

    tmp = tmp_path_factory.mktemp("watched")
    before = ray_processes()
    session = "no session"
    search = _Search(
        *TINY_SEARCH, "--data-root", str(tiny_imagenet), "--num-samples", "3", "--steps", "12",
        "--verify-repeats", "1", "--ranks-per-node", "2", "--cpus-per-worker", "0.5",
        "--search", "tpe",  # the cost model's profile is the fast tier's (test_api's search)
        "--out", str(tmp / "out"), cwd=tmp,
    )  # fmt: skip
    try:
        assert search.dashboard_seen.wait(timeout=180), "no dashboard line within 180 s"
        assert search.url is not None, search.output[-3000:]
        token = (Path.home() / ".ray" / "auth_token").read_text().strip()
        status, body = _get(f"{search.url}/api/version", token)
        session = json.loads(body)["session_name"]
        statuses = {
            "token": status,
            "none": _get(f"{search.url}/api/version")[0],
            "wrong": _get(f"{search.url}/api/version", token + "x")[0],
        }
        try:
            actor = _wait_for_trial_actor(search.url, token, timeout=60)
        except AssertionError as exc:  # that test fails, with this; the others still read
            actor = {"not seen": str(exc)}
        try:
            page = _actors_page(search.url, token, tmp / "ray_dashboard.png")
        except Exception as exc:  # noqa: BLE001 - that test fails with it; the others read
            page = {"not seen": f"{type(exc).__name__}: {exc}"}
        returncode = search.process.wait(timeout=240)
    finally:
        search.stop()
    left = _left_behind(before, session)
    return Watched(search.output, returncode, tmp / "out" / "synthetic-imagenet", statuses,
                   session, actor, left, page)  # fmt: skip


def _actors_page(url: str, token: str, screenshot: Path) -> dict[str, str]:
    """The dashboard's actors page as a person sees it in a browser: it asks for the
    token first ("Authentication Token Required"), the token is typed into its field and
    submitted, and the page, rendered by its scripts, lists a trial actor."""
    from browser_for_tests import available, chromium, settled, text_when

    if not available():
        return {"not seen": "Debian's chromium and chromium-driver are not installed"}
    with chromium() as browser:
        browser.get(f"{url}/#/actors")
        without = text_when(browser, lambda shown: "Authentication Token Required" in shown)

        def submit() -> None:  # found, typed and submitted again if the dialog re-rendered
            field = browser.find_element("css selector", "div[role=dialog] input")
            field.clear()
            field.send_keys(token)
            browser.find_element("xpath", "//div[@role='dialog']//button[.='Submit' or "
                                 ".='SUBMIT']").click()  # fmt: skip

        settled(browser, submit)
        text = text_when(browser, lambda shown: TRIAL_ACTOR in shown
                         and "Authentication Token Required" not in shown, timeout=90)  # fmt: skip
        browser.save_screenshot(str(screenshot))
    return {"text": text, "without_token": without, "screenshot": str(screenshot)}


def test_the_dashboard_needs_the_token(watched: Watched) -> None:
    """Token authentication is on (Ray's default for the instance a search starts), and
    Ray's warning on how to turn it off is left out of the search's output."""
    assert watched.statuses == {"token": 200, "none": 401, "wrong": 403}
    assert "Token authentication is enabled for this Ray cluster" not in watched.output
    assert watched.session.startswith("session_")


def test_the_dashboard_page_in_a_browser_lists_the_trials_behind_the_token(
    watched: Watched,
) -> None:
    """Chromium, headless: the actors page asks for the token; typed in, it lists the
    trial actors (each trial is one)."""
    from browser_for_tests import available

    if not available():
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    page = watched.page
    assert "text" in page, page.get("not seen")
    assert "Authentication Token Required" in page["without_token"]
    assert page["text"].count(TRIAL_ACTOR) >= 1
    states = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD")
    assert any(state in page["text"] for state in states)  # each actor's state, as Ray says
    assert Path(page["screenshot"]).stat().st_size > 10_000  # a rendered page


def test_the_dashboard_shows_each_trial_in_its_own_reservation(watched: Watched) -> None:
    assert watched.actor.get("placement_group_id"), watched.actor  # its CPUs, reserved


def test_the_search_finishes_and_leaves_no_ray_process(watched: Watched) -> None:
    assert watched.returncode == 0, watched.output[-3000:]
    assert "[3/3]" in watched.output and re.search(r"^tuned\s+\d", watched.output, re.M)
    assert watched.left_behind == (set(), [])  # Ray shut down, nothing left behind


def test_both_ranks_of_every_trial_train_at_once_within_the_node(watched: Watched) -> None:
    """--ranks-per-node 2 on 2 cores: both ranks of every trial on this node at once,
    no reservation above the node."""
    with open(watched.folder / "trials.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r["rank_windows"]]
    assert rows
    for row in rows:
        assert float(row["cpus_reserved"]) <= 2  # never more than the node
        assert row["ranks"] == "2" and len(set(row["rank_hosts"].split(";"))) == 1
        (s0, e0), (s1, e1) = (map(float, w.split("-")) for w in row["rank_windows"].split(";"))
        assert max(s0, s1) < min(e0, e1)  # the two ranks ran at the same time


def test_two_ranks_are_verified_against_three_baselines(watched: Watched) -> None:
    best = json.loads((watched.folder / "best_config.json").read_text())
    assert best["ranks_per_node"] == 2
    assert set(best["baselines"]) == {"pytorch-default", "heuristic", "heuristic-rank-share"}
    assert best["baselines"]["heuristic"]["loader"]["num_workers"] == 2  # min(cpus, 8) a rank
    assert best["baselines"]["heuristic-rank-share"]["loader"]["num_workers"] == 1
    assert "heuristic-rank-share" in watched.output
