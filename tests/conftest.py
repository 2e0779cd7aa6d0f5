"""Shared fixtures: a tiny real JPEG dataset and Ray hygiene."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raytune_loader.synthetic import ensure_synthetic_imagenet

TESTS = Path(__file__).parent
REPO = TESTS.parent


@pytest.fixture(scope="session")
def tiny_imagenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """96 real JPEG files in the synthetic-imagenet layout (<root>/train/<class>/...)."""
    root = tmp_path_factory.mktemp("data") / "synthetic"
    return ensure_synthetic_imagenet(root, num_images=96, num_classes=8, processes=2)


def ray_processes() -> set[int]:
    """PIDs of Ray daemons started by this user (raylet, gcs_server, dashboard)."""
    out = subprocess.run(
        ["pgrep", "-u", str(os.getuid()), "-f", "raylet|gcs_server|dashboard/dashboard.py"],
        capture_output=True,
        text=True,
    )
    return {int(pid) for pid in out.stdout.split()}


def run_cli(*args: str, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None):
    """The real command line in a subprocess, with tests/ importable for module:function."""
    full_env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{REPO}", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "raytune_loader.search", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
