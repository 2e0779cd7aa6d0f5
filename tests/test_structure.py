"""The package's structure: its imports form no cycle and never point up a layer.

Every import counts, at module level, inside a function or under ``TYPE_CHECKING``:
each is an arrow a reader follows. The layers are ARCHITECTURE.md's roles, bottom up;
a module may import its own layer's and the ones below.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "raytune_loader"
LAYERS = [
    ("foundations", "errors progress factories hardware nvml trainers"),
    ("the candidate", "space backoff"),
    ("data and loaders", "synthetic decoders transforms pipeline sharding sources sources.base "
     "sources.factory sources.hf_tables sources.image_folders sources.torchvision_sets "
     "sources.webdataset_shards datasets batches streams loader memory models step options "
     "job prepare"),
    ("measurement", "steady watch memoryfit outcomes measure ranks profile costmodel raydata"),
    ("after the search", "verify selection records findings probes bestconfig results searcher"),
    ("Ray", "tuner trainable"),
    ("command lines", "api search bench report plots console __main__ raytune_loader"),
]  # fmt: skip
LAYER = {module: i for i, (_, modules) in enumerate(LAYERS) for module in modules.split()}


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    name = ".".join(parts)
    return "raytune_loader" if name == "__init__" else name.removesuffix(".__init__")


def imports() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports, anywhere in it."""
    modules = {_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            found: list[str] = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "raytune_loader"
            ):
                base = node.module.removeprefix("raytune_loader").lstrip(".")  # type: ignore[union-attr]
                found += [base] + [f"{base}.{a.name}".lstrip(".") for a in node.names]
            elif isinstance(node, ast.Import):
                found += [a.name.removeprefix("raytune_loader").lstrip(".") for a in node.names
                          if a.name.startswith("raytune_loader")]  # fmt: skip
            graph[name] |= {m for m in found if m in modules and m != name}
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


def test_the_imports_form_no_cycle() -> None:
    assert cycles(imports()) == []


def test_no_import_points_up_a_layer_and_every_module_has_one() -> None:
    graph = imports()
    assert sorted(set(graph) - set(LAYER)) == []  # a new module: give it a layer
    up = [
        f"{a} ({LAYERS[LAYER[a]][0]}) imports {b} ({LAYERS[LAYER[b]][0]})"
        for a, targets in graph.items()
        for b in sorted(targets)
        if LAYER[b] > LAYER[a]
    ]
    assert up == []


def test_the_check_finds_a_cycle_and_an_arrow_up() -> None:
    """The checks themselves: a cycle of three and an import from a lower layer."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert LAYER["space"] < LAYER["measure"] and "space" in imports()["measure"]
