"""Pages seen in a real browser: Debian's Chromium, headless, driven by Selenium through
Debian's ChromeDriver (``apt-get install chromium chromium-driver``; ``.ci/run``
installs them). The flags keep Chromium off the network it would otherwise try at
start (this machine's is closed): background networking, component updates, sync."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000")  # fmt: skip


def available() -> bool:
    """Whether Chromium and ChromeDriver are installed; with ``REQUIRE_CHROMIUM`` set (CI
    sets it, having installed them) their absence is an error, not a skip."""
    found = Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()
    if not found and os.environ.get("REQUIRE_CHROMIUM"):
        raise RuntimeError(f"REQUIRE_CHROMIUM is set but {CHROMIUM} or {CHROMEDRIVER} is missing: "
                           "apt-get install chromium chromium-driver")  # fmt: skip
    return found


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a Selenium driver) with an empty profile of its own, quit and
    its profile removed when the block ends."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def text_when(driver: Any, shows: Callable[[str], bool], timeout: float = 60) -> str:
    """The page's visible text once ``shows`` accepts it (the page renders with its
    scripts, after the load); an AssertionError with what it showed otherwise. A read
    that meets an element the scripts just replaced is read again."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = settled(driver, lambda: driver.find_element("tag name", "body").text)
        if shows(text):
            return text
        time.sleep(0.5)
    raise AssertionError(f"the page did not show it within {timeout:.0f} s: {text[:2000]}")


def settled(driver: Any, act: Callable[[], T], timeout: float = 30) -> T:
    """``act()``, done again from the start while it meets an element that the page's
    scripts replaced after it was found (Selenium's StaleElementReferenceException: a
    React page re-renders as its data arrives); the last such error past ``timeout``."""
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + timeout
    while True:
        try:
            return act()
        except StaleElementReferenceException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
