"""The Ray dashboard of a running search: token-protected, and it shows the trial actors.

Ray 2.60 protects the dashboard with token authentication (the token is in
``~/.ray/auth_token``; its HTTP middleware reads ``Authorization: Bearer <token>``,
answering 401 without a token and 403 with a wrong one). Tune runs each trial of
the function trainable as an actor of class ``ImplicitFunc``.
"""

from __future__ import annotations

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
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, TESTS, ray_processes

pytestmark = pytest.mark.slow  # real searches: pytest -m slow

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


def test_dashboard_needs_the_token_and_shows_the_trials(
    tiny_imagenet: Path, tmp_path: Path
) -> None:
    before = ray_processes()
    session = "no session"
    search = _Search(
        "--data-root", str(tiny_imagenet), "--synthetic-images", "96", "--num-samples", "3",
        "--batch-size", "8", "--steps", "30", "--warmup-steps", "1", "--report-every", "10",
        "--samples-per-trial", "64", "--verify-top", "1", "--verify-repeats", "1",
        "--search", "tpe", "--out", str(tmp_path / "results"),
        cwd=tmp_path,
    )  # fmt: skip
    try:
        assert search.dashboard_seen.wait(timeout=180), "no dashboard line within 180 s"
        assert search.url is not None, search.output[-3000:]
        token = (Path.home() / ".ray" / "auth_token").read_text().strip()

        status, body = _get(f"{search.url}/api/version", token)
        session = json.loads(body)["session_name"]
        assert status == 200 and session.startswith("session_")
        assert _get(f"{search.url}/api/version")[0] == 401  # no token
        assert _get(f"{search.url}/api/version", token + "x")[0] == 403  # a wrong one

        actor = _wait_for_trial_actor(search.url, token, timeout=60)
        assert actor["placement_group_id"]  # the trial runs in its own CPU reservation

        assert search.process.wait(timeout=240) == 0, search.output[-3000:]
    finally:
        search.stop()
    assert "[3/3]" in search.output and re.search(r"^tuned\s+\d", search.output, re.M)
    assert _left_behind(before, session) == (set(), [])  # Ray shut down, nothing left behind
