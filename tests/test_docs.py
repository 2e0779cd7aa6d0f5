"""The contracts under docs/ say what the code does: every flag with its default, every
trials.csv column in order, every best_config.json key; and nothing points outside."""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

import pytest

from conftest import REPO, Searched
from raytune_loader import bench, search
from raytune_loader.candidates.config import LoaderConfig
from raytune_loader.measuring.records import TrialRecord, write_trials_csv

DOCS = REPO / "docs"
SEARCH_HEADING = "## `python -m raytune_loader.search`"
BENCH_HEADING = "## `python -m raytune_loader.bench`"


def _section(text: str, heading: str) -> str:
    """From ``heading`` to the next heading of the same level or higher."""
    level = heading.split(" ")[0]
    start = text.index(heading + "\n")
    rest = text[start + len(heading) :]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", rest, re.M)]
    return rest[: ends[0]] if ends else rest


def _rows(section: str) -> dict[str, list[str]]:
    """Markdown table rows by the code-quoted names in their first cell, in order."""
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            for name in re.findall(r"`([^`]+)`", cells[0]):
                rows[name] = cells
    return rows


def _flag_rows(heading: str) -> dict[str, list[str]]:
    """The option tables of one command line, by flag (``--steps S`` is ``--steps``)."""
    rows = _rows(_section((DOCS / "cli.md").read_text(), heading))
    return {name.split(" ")[0]: cells for name, cells in rows.items()}


def _shows(cell: str, default: object) -> bool:
    """Whether a table cell gives ``default`` (600.0 written 600), as a word of its own."""
    shown = f"{default:g}" if isinstance(default, float) else str(default)
    return re.search(rf"(?<![\w.-]){re.escape(shown)}(?![\w-]|\.\w)", cell) is not None


NAMED = ("baselines", "per_class", "per_core", "collate_s", "receive_s", "hand_over_s", "finish_s")


def _keys(value: object, skip: tuple[str, ...] = NAMED) -> set[str]:
    """Every key of the nested objects in ``value`` (those under ``skip`` are names)."""
    if isinstance(value, list):
        return set().union(*(_keys(item) for item in value))
    if not isinstance(value, dict):
        return set()
    nested = (_keys(item) for key, item in value.items() if key not in skip)
    return set(value).union(*nested)


@pytest.mark.parametrize(
    ("parser", "heading"),
    [(search.get_args_parser(), SEARCH_HEADING), (bench.get_args_parser(), BENCH_HEADING)],
    ids=["search", "bench"],
)
def test_every_flag_is_documented_with_its_default(
    parser: argparse.ArgumentParser, heading: str
) -> None:
    rows = _flag_rows(heading)
    for action in parser._actions:  # argparse lists its options nowhere public
        flags = [s for s in action.option_strings if s.startswith("--") and s != "--help"]
        for flag in flags:
            assert flag in rows, f"{flag} is missing from docs/cli.md under {heading}"
        if flags and action.default not in (None, False, argparse.SUPPRESS):
            cell = rows[flags[0]][1]
            assert _shows(cell, action.default), f"{flags[0]}: default {action.default!r}"


@pytest.mark.parametrize(
    "parser", [search.get_args_parser(), bench.get_args_parser()], ids=["search", "bench"]
)
def test_help_names_every_default(parser: argparse.ArgumentParser) -> None:
    """``--help`` gives each option's default (as its help words it, or appended), and
    names none where there is none (a switch that is off, a value worked out later)."""
    formatter = parser._get_formatter()
    for action in parser._actions:
        text = formatter._expand_help(action) if action.help else ""
        default = action.default  # by identity: 0 (--seed) is a default to name
        if action.option_strings and not any(
            default is v for v in (None, False, argparse.SUPPRESS)
        ):
            assert _shows(text, default), f"{action.dest}: {text!r}"
        else:
            assert "(default None)" not in text and "(default False)" not in text


def test_the_trials_csv_columns_are_documented_in_the_order_they_are_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "trials.csv"
    write_trials_csv(path, [TrialRecord("t1", "ok", config=LoaderConfig(8))])
    with open(path) as handle:
        written = next(csv.reader(handle))
    documented = list(_rows(_section((DOCS / "outputs.md").read_text(), "## `trials.csv`")))
    assert documented == written


def test_every_key_of_a_real_best_config_json_is_documented(searched: Searched) -> None:
    best = json.loads((searched.folder / "best_config.json").read_text())
    doc = (DOCS / "best_config.md").read_text()
    top = _rows(_section(doc, "## Top-level keys"))
    assert [key for key in best if key not in top] == []
    nested = sorted(_keys(best) - set(best))
    assert [key for key in nested if not re.search(rf"\b{re.escape(key)}\b", doc)] == []


def test_the_report_s_sections_are_documented_in_order(searched: Searched) -> None:
    written = [
        line for line in (searched.folder / "report.md").read_text().splitlines()
        if line.startswith("#")
    ]  # fmt: skip
    documented = _rows(_section((DOCS / "outputs.md").read_text(), "## `report.md`"))
    patterns = [re.escape(name).replace(r"<dataset>", ".+").replace(r"<model>", ".+")
                for name in documented]  # fmt: skip
    assert len(written) == len(patterns)
    for line, pattern in zip(written, patterns, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)


POINTERS = re.compile(
    r"DESIGN\.md|/work/shared|\.\./shared|\bissue\s*#?\s*\d+|\bnote of issue", re.I
)


TEXT = (".py", ".md", ".sh", ".txt")


def test_the_repository_points_at_nothing_a_clone_lacks() -> None:
    """No design note or issue tracker a user cloning the repository does not have."""
    files = [REPO / "README.md", REPO / "ARCHITECTURE.md"]
    for folder in ("raytune_loader", "tests", "experiments", "docs", "results"):
        files += [p for p in (REPO / folder).rglob("*") if p.suffix in TEXT]
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in files
        if path.resolve() != Path(__file__).resolve()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if POINTERS.search(line)
    ]
    assert found == []


def test_every_search_option_is_a_flag_of_the_command_line_and_of_its_reference() -> None:
    """SearchOptions' fields are the command line's flags (their docstring's rule: the
    name dashed, less a trailing ``_s``), each parsed into that field and listed in
    docs/cli.md: a knob added to one and not the others fails here."""
    import dataclasses
    import re

    from raytune_loader.search import get_args_parser
    from raytune_loader.tuning.options import SearchOptions

    reference = set(re.findall(r"`(--[a-z0-9-]+)", (DOCS / "cli.md").read_text()))
    parser = get_args_parser()
    dests: dict[str, set[str]] = {}
    for action in parser._actions:  # noqa: SLF001 - argparse's list of what it parses
        dests.setdefault(action.dest, set()).update(action.option_strings)
    renamed = {"batch_sizes": "--batch-size"}
    for field in dataclasses.fields(SearchOptions):
        flag = renamed.get(field.name, "--" + field.name.removesuffix("_s").replace("_", "-"))
        assert flag in reference, f"{field.name}: {flag} is not in docs/cli.md"
        parsed = dests.get(field.name, set()) | dests.get(field.name.removesuffix("_s"), set())
        assert flag in parsed, f"{field.name}: {flag} does not parse into it"
