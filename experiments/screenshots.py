"""The pages of the README's screenshots, taken in headless Chromium: the Ray dashboard's
actors page during a search (the token typed into its prompt), and optuna-dashboard on
the finished search's study.

    python experiments/screenshots.py [--num-samples 6]

Needs Debian's chromium and chromium-driver (``apt-get install chromium
chromium-driver``) and the test extra (selenium, optuna-dashboard). Runs the default
search on the embedded dataset, and writes docs/images/ray_dashboard.png and
docs/images/optuna_dashboard.png.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from browser_for_tests import chromium, text_when  # noqa: E402
from env_for_tests import free_port  # noqa: E402

IMAGES = REPO / "docs" / "images"
DASHBOARD = re.compile(r"^==> Ray dashboard: (http://127\.0\.0\.1:\d+) \(")


def ray_dashboard(url: str, token: str, out: Path) -> None:
    with chromium() as browser:
        browser.get(f"{url}/#/actors")
        text_when(browser, lambda shown: "Authentication Token Required" in shown)
        browser.find_element("css selector", "div[role=dialog] input").send_keys(token)
        browser.find_element("xpath", "//div[@role='dialog']//button[.='Submit' or "
                             ".='SUBMIT']").click()  # fmt: skip
        text_when(browser, lambda shown: "ImplicitFunc" in shown and "ALIVE" in shown, 120)
        browser.save_screenshot(str(out))


def optuna_dashboard(journal: Path, out: Path) -> None:
    port = free_port()
    script = Path(sys.executable).parent / "optuna-dashboard"
    server = subprocess.Popen([str(script), str(journal), "--port", str(port), "--quiet"])
    try:
        time.sleep(3)
        with chromium() as browser:
            browser.get(f"http://127.0.0.1:{port}/dashboard/studies/0")
            text_when(browser, lambda shown: "Best Trial (number=" in shown)
            time.sleep(2)  # the plots' animation
            browser.save_screenshot(str(out))
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-samples", type=int, default=6)
    args = parser.parse_args()
    IMAGES.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="screenshots-"))
    command = [sys.executable, "-m", "raytune_loader.search", "--num-samples",
               str(args.num_samples), "--out", str(out)]  # fmt: skip
    search = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert search.stdout is not None
    for line in search.stdout:
        found = DASHBOARD.match(line)
        if found:
            token = (Path.home() / ".ray" / "auth_token").read_text().strip()
            ray_dashboard(found.group(1), token, IMAGES / "ray_dashboard.png")
            print("wrote", IMAGES / "ray_dashboard.png", flush=True)
            break
    for _ in search.stdout:  # let it finish
        pass
    if search.wait():
        raise SystemExit("the search failed")
    optuna_dashboard(out / "synthetic-imagenet" / "study.journal", IMAGES / "optuna_dashboard.png")
    print("wrote", IMAGES / "optuna_dashboard.png")


if __name__ == "__main__":
    main()
