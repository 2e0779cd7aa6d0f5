"""The README is a user's: short, the two quick-start commands, links that resolve, and
every figure it quotes taken from the file under results/ that it names.

A figure is a number standing alone in prose or in a table row: 452, 2.07x, 0.71, 24%.
Numbers in `code`, in code blocks of commands or Python, and inside words (resnet50,
bf16, H200, two-core written 2-core) are not figures. Each figure must sit in a sentence
or a table row that names a file under results/benchmarks/ or results/gpu/, and appear
in that file: literally in a text file; in a JSON file, as one of its numbers rounded the
way the README writes it (0.71 is 0.7124; 71% is 0.7124 or 71.2). An output block (a
fenced block that is not bash or Python) is a quote: each of its lines must be a line of
the text file the paragraph before it names. results/README.md, the index of the figures,
is held to the same rule; a sentence of docs/ or CONTRIBUTING.md that names such a file
is checked the same way."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from conftest import REPO

README = REPO / "README.md"
RESULTS = REPO / "results"
MAX_LINES = 300
QUICK_START = (
    "pip install -e . && python -m raytune_loader.search",
    "pip install -e '.[test]' && pytest -q",
)

# A number not inside a word, maybe a ratio (2.07x) or a share (71%).
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(x|%)?(?![\w-]*[A-Za-z_]|\.\d)")
# A file of figures, named from the repository (results/...) or from results/.
SOURCE = re.compile(r"(?<![\w/])(?:results/)?((?:benchmarks|gpu)/[\w./-]*\w)")
CODE_SPAN = re.compile(r"`[^`]*`")
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")
LIST_MARK = re.compile(r"^\s*(?:[-*]|\d+\.)\s+")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*\[(])")
CODE_LANGUAGES = ("bash", "sh", "python", "py", "toml", "json", "yaml")
HISTORY = re.compile(
    r"\bsessions?\b|\b(?:last|this|next|previous) stop\b|\bI (?:tried|measured|found|ran)\b"
    r"|\bthe last run\b|\bfirst H200 run\b",
    re.I,
)


@dataclass(frozen=True)
class Unit:
    """A sentence, a table row, or a quoted output block, with where it starts."""

    path: Path
    line: int
    text: str
    quote: tuple[str, ...] | None = None  # an output block's lines; ``text`` names its file

    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def _units(path: Path) -> Iterator[Unit]:
    """A markdown file's sentences, table rows and output blocks."""
    lines = path.read_text().splitlines()
    paragraph: list[tuple[int, str]] = []
    last_paragraph = ""

    def flush() -> Iterator[Unit]:
        nonlocal paragraph, last_paragraph
        if paragraph:
            text = " ".join(LIST_MARK.sub("", line) for _, line in paragraph)
            last_paragraph = text
            for sentence in SENTENCE_END.split(text):
                yield Unit(path, paragraph[0][0], sentence)
        paragraph = []

    number = 0
    while number < len(lines):
        line = lines[number]
        number += 1
        if line.lstrip().startswith("```"):
            yield from flush()
            language = line.strip().strip("`").strip().split(" ")[0]
            start = number
            block = []
            while number < len(lines) and not lines[number].lstrip().startswith("```"):
                block.append(lines[number])
                number += 1
            number += 1
            if language not in CODE_LANGUAGES:
                yield Unit(path, start, last_paragraph, tuple(block))
        elif line.startswith("|"):
            yield from flush()
            if not re.fullmatch(r"[|:\-\s]+", line):
                yield Unit(path, number, line)
        elif not line.strip() or line.startswith("#") or LIST_MARK.match(line):
            yield from flush()
            if line.startswith("#"):
                last_paragraph = ""
                yield Unit(path, number, line)
            elif line.strip():
                paragraph.append((number, line))
        else:
            paragraph.append((number, line))
    yield from flush()


def _figures(text: str) -> list[tuple[str, str]]:
    """The figures of a sentence or a row: (number, suffix), outside code and links."""
    prose = LINK_TARGET.sub("]", CODE_SPAN.sub(" ", text))
    return FIGURE.findall(prose)


def _sources(text: str) -> list[Path]:
    """The files of figures a sentence or a row names (a README.md is not one)."""
    return [RESULTS / name for name in SOURCE.findall(text) if Path(name).name != "README.md"]


@cache
def _numbers(path: Path) -> tuple[float, ...]:
    """Every number a JSON file holds, in its values and inside its strings."""
    found: list[float] = []

    def walk(value: object) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, int | float):
            found.append(abs(float(value)))
        elif isinstance(value, str):
            found.extend(float(n) for n in re.findall(r"\d+(?:\.\d+)?", value))
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(json.loads(path.read_text()))
    return tuple(found)


def _holds(path: Path, number: str, suffix: str) -> bool:
    """Whether ``path`` holds the figure: literally in text, rounded as written in JSON."""
    if path.suffix != ".json":
        return re.search(rf"(?<![\d.]){re.escape(number)}(?!\d|\.\d)", path.read_text()) is not None
    decimals = len(number.partition(".")[2])
    tolerance = 0.5 * 10**-decimals + 1e-9
    scales = (1, 100) if suffix == "%" else (1,)
    return any(abs(v * s - float(number)) <= tolerance for v in _numbers(path) for s in scales)


def _unsourced(unit: Unit, strict: bool) -> list[str]:
    """What is wrong with one unit's figures, each as a line of a failure message."""
    sources = _sources(unit.text)
    missing = [f"{unit.where()}: names {p.relative_to(REPO)}, which does not exist"
               for p in sources if not p.is_file()]  # fmt: skip
    sources = [p for p in sources if p.is_file()]
    if unit.quote is not None:
        quoted = [line.rstrip() for line in unit.quote if line.strip() not in ("", "...")]
        if not sources:
            figures = strict and any(_figures(line) for line in quoted)
            return [f"{unit.where()}: an output block with figures after a paragraph "
                    "naming no file under results/"] if figures else []  # fmt: skip
        texts = [p.read_text().splitlines() for p in sources if p.suffix != ".json"]
        return missing + [
            f"{unit.where()}: the quoted line is in no text file the paragraph before names "
            f"({[str(p.relative_to(REPO)) for p in sources]}): {line!r}"
            for line in quoted
            if not any(line in (text_line.rstrip() for text_line in text) for text in texts)
        ]
    figures = _figures(unit.text)
    if not figures or not (strict or sources):
        return missing
    if not sources:
        shown = ", ".join(n + s for n, s in figures)
        return [f"{unit.where()}: {shown} in a sentence naming no file under results/: "
                f"{unit.text.strip()[:160]!r}"]  # fmt: skip
    return missing + [
        f"{unit.where()}: {number}{suffix} is in none of "
        f"{[str(p.relative_to(REPO)) for p in sources]}: {unit.text.strip()[:160]!r}"
        for number, suffix in figures
        if not any(_holds(p, number, suffix) for p in sources)
    ]


def _documents() -> list[Path]:
    return [
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
        REPO / "ARCHITECTURE.md",
        RESULTS / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
    ]


def test_the_readme_is_a_short_one() -> None:
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_the_quick_start_is_the_two_commands() -> None:
    """Two commands from a fresh clone: the main job on the default dataset, the tests."""
    text = README.read_text()
    assert "\n## Quick start\n" in text
    block = re.search(r"```bash\n(.*?)```", text[text.index("\n## Quick start\n") :], re.S)
    assert block is not None, "no bash block under ## Quick start"
    commands = [line.strip() for line in block.group(1).splitlines()
                if line.strip() and not line.strip().startswith("#")]  # fmt: skip
    assert commands == list(QUICK_START)


@pytest.mark.parametrize(
    "path", [README, RESULTS / "README.md"], ids=lambda p: str(p.relative_to(REPO))
)
def test_every_figure_is_in_the_file_its_sentence_names(path: Path) -> None:
    problems = [problem for unit in _units(path) for problem in _unsourced(unit, strict=True)]
    assert problems == [], "\n".join(problems)


def test_a_figure_of_the_docs_beside_a_results_file_is_in_that_file() -> None:
    pages = [REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
    problems = [
        problem
        for page in pages
        if page.is_file()
        for unit in _units(page)
        for problem in _unsourced(unit, strict=False)
    ]
    assert problems == [], "\n".join(problems)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for a markdown file's headings."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_resolves() -> None:
    """Links between the README, the docs and the results index, anchors included."""
    broken = []
    for page in _documents():
        if not page.is_file():
            continue
        text = CODE_SPAN.sub("", re.sub(r"```.*?```", "", page.read_text(), flags=re.S))
        for target in LINK_TARGET.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            name, _, anchor = target.partition("#")
            linked = (page.parent / name).resolve() if name else page
            if not linked.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def test_every_page_of_the_docs_is_on_their_index() -> None:
    """docs/README.md lists every page, and the README links it."""
    index = (REPO / "docs" / "README.md").read_text()
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "README.md")
    assert [p for p in pages if f"]({p})" not in index] == []
    assert "](docs/README.md)" in README.read_text()


def test_the_readme_s_flags_are_the_command_line_s() -> None:
    """The README shows a few options; docs/cli.md has them all."""
    rows = [line for line in README.read_text().splitlines() if line.startswith("| `--")]
    flags = {flag for row in rows for flag in re.findall(r"`(--[\w-]+)", row.split(" | ")[0])}
    cli = (REPO / "docs" / "cli.md").read_text()
    assert sorted(f for f in flags if f"`{f}" not in cli) == []
    assert len(rows) <= 12, "the whole options table belongs in docs/cli.md"


def test_the_readme_and_the_docs_say_what_is_true_not_what_happened() -> None:
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    found = [
        f"{page.relative_to(REPO)}:{number}: {line.strip()}"
        for page in pages
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert found == []
