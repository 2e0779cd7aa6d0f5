"""The package itself (raytune_loader/__init__.py): its public names, imported on first
use, so that a process importing one light module does not import torch."""

from __future__ import annotations

import ast
import importlib
import inspect
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
    """The synthetic dataset's pool processes import raytune_loader.sources.synthetic, and with it
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


def _modules() -> list[str]:
    names = []
    for path in sorted((REPO / "raytune_loader").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] in ("__main__", "_moved"):
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_public_class_and_function_says_what_it_does() -> None:
    """A docstring on every public class and function, and on every public method (its
    own, or the one it implements: a contract's method says it once)."""
    silent = []
    for name in _modules():
        module = importlib.import_module(name)
        tree = ast.parse(Path(module.__file__).read_text())  # type: ignore[arg-type]
        for node in tree.body:  # its own: a dataclass's generated signature is no docstring
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                if not ast.get_docstring(node):
                    silent.append(f"{name}.{node.name}")
                if isinstance(node, ast.ClassDef):
                    cls = getattr(module, node.name)
                    for sub in node.body:
                        public = isinstance(sub, ast.FunctionDef) and not sub.name.startswith("_")
                        if public and not inspect.getdoc(getattr(cls, sub.name)):
                            silent.append(f"{name}.{node.name}.{sub.name}")
    assert silent == []


def test_the_public_api_says_its_arguments_and_what_it_returns() -> None:
    """The names of ``_PUBLIC`` and their public methods: ``Args`` where they take any,
    ``Returns`` always (properties and exceptions aside), as Optuna's API does."""
    missing = []
    for name in raytune_loader._PUBLIC:
        obj = getattr(raytune_loader, name)
        if inspect.isclass(obj) and issubclass(obj, (BaseException, Warning)):
            continue
        members = [(name, obj)] if inspect.isfunction(obj) else [
            (f"{name}.{m}", getattr(obj, m)) for m, v in vars(obj).items()
            if not m.startswith("_") and isinstance(v, (classmethod, staticmethod))
            or not m.startswith("_") and inspect.isfunction(v)
        ]  # fmt: skip
        for shown, function in members:
            doc = inspect.getdoc(function) or ""
            taken = [p for p in inspect.signature(function).parameters if p not in ("self", "cls")]
            if taken and "\nArgs:\n" not in doc:
                missing.append(f"{shown}: Args")
            if "\nReturns:\n" not in doc:
                missing.append(f"{shown}: Returns")
    assert missing == []
