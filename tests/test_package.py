"""The package itself (raytune_loader/__init__.py): its public names, imported on first
use, so that a process importing one light module does not import torch."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import raytune_loader
from conftest import REPO


def test_the_package_s_public_names_resolve_and_match_what_type_checkers_see() -> None:
    public = raytune_loader._PUBLIC
    for name, module in public.items():
        found = getattr(raytune_loader, name)
        assert found is getattr(importlib.import_module(f"raytune_loader.{module}"), name)
    tree = ast.parse(Path(raytune_loader.__file__).read_text())
    checked = next(n for n in tree.body if isinstance(n, ast.If))  # if TYPE_CHECKING:
    seen = {
        alias.name: node.module.removeprefix("raytune_loader.")
        for node in checked.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    assert seen == public
    with pytest.raises(AttributeError, match="no attribute 'run_serach'"):
        raytune_loader.run_serach  # noqa: B018


def test_a_process_that_only_writes_jpeg_files_does_not_import_torch(tmp_path: Path) -> None:
    """The synthetic dataset's pool processes import raytune_loader.synthetic, and with it
    the package: seconds of torch a process before the package imported its names lazily."""
    code = (
        "import sys; from pathlib import Path; from raytune_loader import synthetic; "
        f"synthetic.ensure_synthetic_imagenet(Path({str(tmp_path / 'd')!r}), 4, 2); "
        "print(sorted(m for m in ('torch', 'torchvision', 'ray') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
    assert len(list((tmp_path / "d" / "train").rglob("*.JPEG"))) == 4
