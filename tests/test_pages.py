"""The pages people open, seen in headless Chromium (tests/browser_for_tests.py):
optuna-dashboard's own server on a finished search's study (the Ray dashboard during
a search is in tests/test_dashboard.py). The page, once its scripts rendered it, must
list as many trials as trials.csv and show the same best value."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from browser_for_tests import available, chromium, text_when
from env_for_tests import free_port

pytestmark = [pytest.mark.slow]

needs_chromium = pytest.mark.skipif(
    not available(), reason="needs Debian's chromium and chromium-driver (.ci/run installs them)"
)


def _serving(journal: Path, port: int) -> subprocess.Popen:
    """optuna-dashboard on ``journal``, its page answering."""
    script = Path(sys.executable).parent / "optuna-dashboard"
    server = subprocess.Popen([str(script), str(journal), "--port", str(port), "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2)
            return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise AssertionError("optuna-dashboard did not answer within 60 s")


@needs_chromium
def test_optuna_dashboard_shows_every_trial_and_the_best_value(searched, tmp_path: Path) -> None:  # noqa: ANN001
    folder = searched.folder
    with open(folder / "trials.csv") as handle:
        rows = list(csv.DictReader(handle))
    best = max(float(r["util"]) for r in rows if r["status"] == "ok")
    port = free_port()
    server = _serving(folder / "study.journal", port)
    try:
        with chromium() as page:
            page.get(f"http://127.0.0.1:{port}/dashboard")
            listed = text_when(page, lambda text: "raytune_loader-synthetic-imagenet" in text)
            assert "Direction: MAXIMIZE" in listed
            page.get(f"http://127.0.0.1:{port}/dashboard/studies/0/trials")
            text_when(page, lambda text: f"{len(rows)} Trials" in text)
            page.get(f"http://127.0.0.1:{port}/dashboard/studies/0")
            shown = text_when(page, lambda text: "Best Trial (number=" in text)
            value = shown.split("Best Trial (number=", 1)[1].splitlines()[1]
            assert float(value) == pytest.approx(best, rel=1e-9), shown[-800:]
            page.save_screenshot(str(tmp_path / "optuna_dashboard.png"))
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert (tmp_path / "optuna_dashboard.png").stat().st_size > 10_000  # a rendered page
