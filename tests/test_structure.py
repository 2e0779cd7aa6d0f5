"""The package's structure against its one map, ARCHITECTURE.md's "Rooms, by layer".

Every module is on the map once, in a layer; its imports form no cycle and never point up
a layer; each room's contract names no room above it, and every room it imports. Every
import counts, at module level, inside a function or under ``TYPE_CHECKING``: each is
an arrow a reader follows. The map is read here, not copied: one source of truth.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "raytune_loader"
MAP = REPO / "ARCHITECTURE.md"
FOUNDATIONS = ("errors", "progress", "factories", "files", "wrapped", "machine")


def read_map(text: str) -> dict[str, int]:
    """Each module of the map (``room/module``, ``room/`` for a room's ``__init__``, a
    bare name at the top) and its layer, from the table under "Rooms, by layer"."""
    section = text.split("\n## Rooms, by layer\n", 1)[1].split("\n## ", 1)[0]
    layers: dict[str, int] = {}
    layer = 0
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        if cells[0]:
            layer = int(cells[0].split()[0])
        (module,) = re.findall(r"`([^`]+)`", cells[1])
        assert module not in layers, f"{module} is on the map twice"
        layers[module] = layer
    return layers


def _name(path: Path) -> str:
    """A module as the map names it."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        return "/".join(parts[:-1]) + "/"
    return "/".join(parts)


def _target(module: str, modules: set[str]) -> str | None:
    """``raytune_loader.a.b`` as the map names it: the module, or the room's face."""
    path = module.removeprefix("raytune_loader").lstrip(".").replace(".", "/")
    if path == "":
        return "__init__"
    if path in modules:
        return path
    return f"{path}/" if f"{path}/" in modules else None


def imports() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports, anywhere in it."""
    files = {_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: set[str | None] = set()
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "raytune_loader"
            ):
                for alias in node.names:  # a module of the package, or a name of one
                    module = _target(f"{node.module}.{alias.name}", set(files))
                    targets.add(module or _target(node.module, set(files)))  # type: ignore[arg-type]
            elif isinstance(node, ast.Import):
                targets |= {_target(a.name, set(files)) for a in node.names
                            if a.name.startswith("raytune_loader")}  # fmt: skip
            graph[name] |= {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def room(module: str) -> str:
    """The room a module lives in: its folder, or the module itself at the top."""
    return module.split("/")[0]


def test_every_module_is_on_the_map_and_nothing_else_is() -> None:
    on_map, in_package = set(read_map(MAP.read_text())), set(imports())
    assert sorted(in_package - on_map) == []  # a new module: give it its row
    assert sorted(on_map - in_package) == []  # a module gone: drop its row


def test_the_imports_form_no_cycle() -> None:
    assert cycles(imports()) == []


def test_no_import_points_up_a_layer() -> None:
    layer = read_map(MAP.read_text())
    up = [
        f"{a} (layer {layer[a]}) imports {b} (layer {layer[b]})"
        for a, targets in imports().items()
        for b in sorted(targets)
        if layer[b] > layer[a]
    ]
    assert up == []


def test_each_room_s_contract_names_what_it_imports_and_nothing_above_it() -> None:
    """A room's ``__init__`` says what it may import; the code keeps to it, and the map's
    layers allow it."""
    layer = read_map(MAP.read_text())
    graph = imports()
    for face in (m for m in layer if m.endswith("/")):
        doc = ast.get_docstring(ast.parse((PACKAGE / face / "__init__.py").read_text())) or ""
        said = re.search(r"May import:(.*?)\.(\s|$)", doc, re.S)
        assert said, f"{face}__init__.py does not say what it may import"
        words = said.group(1)
        allowed = set(re.findall(r"``(\w+)``", words))
        if "foundations" in words:
            allowed |= set(FOUNDATIONS)
        if "every room below it" in words:
            allowed |= {room(m) for m in layer if layer[m] < layer[face]}
        imported = {room(b) for a in graph if a.startswith(face) for b in graph[a]}
        assert imported - {room(face)} <= allowed, f"{face} imports {imported - allowed}"
        above = {a for a in allowed if any(layer[m] > layer[face] for m in layer if room(m) == a)}
        assert above == set(), f"{face} may import {above}, above it on the map"


def test_the_checks_find_a_cycle_an_arrow_up_and_a_module_off_the_map(tmp_path: Path) -> None:
    """The checks themselves: a cycle of three, an import from a lower layer, a map row."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    layer = read_map(MAP.read_text())
    assert layer["candidates/config"] < layer["measuring/segment"]
    assert "candidates/config" in imports()["measuring/segment"]
    assert layer["engines/base"] == layer["engines/"] == 5
    table = "\n## Rooms, by layer\n\n| layer | module | owns |\n| --- | --- | --- |\n"
    assert read_map(table + "| 1 low | `a` | x |\n| | `b/c` | y |\n| 2 high | `d/` | z |\n") == {
        "a": 1, "b/c": 1, "d/": 2,
    }  # fmt: skip
    with pytest.raises(AssertionError, match="twice"):
        read_map(table + "| 1 low | `a` | x |\n| | `a` | y |\n")
