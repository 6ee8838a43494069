"""The README and docs/ stay true to the code: every `tandem …` command they show names a real subcommand
and only flags its `--help` lists, every `make` target exists, every relative link and #anchor resolves,
and every code block parses. Fast tier: no model is loaded, nothing is run but `--help`."""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tandem.cli import app

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "docs" / "lab"
RECORDS = sorted(LAB.glob("*.md"))
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *RECORDS]
# The lab notebook's records keep what was run when it was measured: their links are checked, their commands
# and the source paths they name are not (the code has moved on since).
COMMAND_PAGES = [page for page in PAGES if page.parent != LAB]
BENCHMARKS_MAX_CHARS = 30_000

FENCE = re.compile(r"^\s*```(\S*)\s*$")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
MAKE_TARGET = re.compile(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", re.MULTILINE)
SUBCOMMAND_WORD = re.compile(r"[a-z][a-z0-9-]*")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    lang: str
    text: str


@dataclass(frozen=True)
class Command:
    """One command as the docs show it: where, its words after the program name, and how it was written."""

    where: str
    words: tuple[str, ...]
    shown: str


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


@functools.cache
def _split(page: Path) -> tuple[tuple[Block, ...], str]:
    """A page's fenced blocks, and its prose with the blocks blanked out (line numbers kept)."""
    blocks: list[Block] = []
    prose: list[str] = []
    lang: str | None = None
    start = 0
    body: list[str] = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if lang is None and fence:
            lang, start, body = fence.group(1).lower(), number, []
            prose.append("")
        elif lang is not None and fence and not fence.group(1):
            blocks.append(Block(page, start, lang, "\n".join(body)))
            lang = None
            prose.append("")
        elif lang is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    assert lang is None, f"{_rel(page)}:{start}: unclosed code fence"
    return tuple(blocks), "\n".join(prose)


def _shell_lines(text: str) -> list[tuple[int, str]]:
    """Logical lines of a shell block (backslash continuations joined), with their offset in the block."""
    lines: list[tuple[int, str]] = []
    pending: list[str] = []
    first = 0
    for offset, raw in enumerate(text.splitlines()):
        if not pending:
            first = offset
        if raw.rstrip().endswith("\\"):
            pending.append(raw.rstrip()[:-1])
            continue
        pending.append(raw)
        lines.append((first, " ".join(pending)))
        pending = []
    if pending:
        lines.append((first, " ".join(pending)))
    return lines


def _commands_in_words(words: list[str]) -> list[tuple[str, ...]]:
    """`tandem …` invocations among a shell line's words, including quoted ones (`ray exec … "tandem …"`)
    and the indexer image's (`docker compose run … indexer SUB …` runs `tandem index SUB …`)."""
    found: list[tuple[str, ...]] = []
    for i, word in enumerate(words):
        if word == "tandem":
            found.append(tuple(words[i + 1:]))
            break
        if word.startswith("tandem "):
            found.extend(_commands_in_words(shlex.split(word)))
    if words[:3] == ["docker", "compose", "run"] and "indexer" in words:
        found.append(("index", *words[words.index("indexer") + 1:]))
    return found


def _shell_commands(block: Block) -> list[Command]:
    commands: list[Command] = []
    for offset, line in _shell_lines(block.text):
        words = shlex.split(line, comments=True)
        for invocation in _commands_in_words(words):
            commands.append(Command(f"{_rel(block.page)}:{block.line + 1 + offset}", invocation, line.strip()))
    return commands


def _inline_commands(page: Path) -> list[Command]:
    """`tandem …` in prose and tables: synopses such as `tandem index export BUNDLE|ROOT --out FILE`."""
    _, prose = _split(page)
    commands: list[Command] = []
    for number, line in enumerate(prose.splitlines(), 1):
        for span in INLINE_CODE.findall(line):
            if span.startswith("tandem "):
                words = re.sub(r"[\[\]()|\\]", " ", span).split()[1:]
                commands.append(Command(f"{_rel(page)}:{number}", tuple(words), span))
    return commands


def _all_commands() -> list[Command]:
    commands: list[Command] = []
    for page in COMMAND_PAGES:
        blocks, _ = _split(page)
        for block in blocks:
            if block.lang in ("bash", "sh", "shell", "console"):
                commands.extend(_shell_commands(block))
        commands.extend(_inline_commands(page))
    return commands


COMMANDS = _all_commands()


@functools.cache
def _help(path: tuple[str, ...]) -> str:
    """`tandem <path> --help`, wide enough that no flag is wrapped or cut."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
    assert result.exit_code == 0, f"tandem {' '.join(path)} --help failed:\n{result.output}"
    return result.output


@functools.cache
def _cli() -> Any:
    """The CLI's command tree, built from the typer app once: each of the ~200 commands the docs show is resolved in
    it, and building it costs more than resolving one."""
    return typer.main.get_command(app)


def _subcommands(command: Any) -> dict[str, Any]:
    """A group's subcommands by name; empty for a command (typer may vendor click, so no isinstance)."""
    return getattr(command, "commands", None) or {}


def _resolve(words: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """The subcommand path the words name, and the bare words left after it that look like subcommands."""
    command: Any = _cli()
    path: list[str] = []
    rest = list(words)
    while _subcommands(command) and rest and rest[0] in _subcommands(command):
        command = _subcommands(command)[rest[0]]
        path.append(rest.pop(0))
    if not _subcommands(command):
        return tuple(path), []
    unknown = [rest[0]] if rest and SUBCOMMAND_WORD.fullmatch(rest[0]) else []
    return tuple(path), unknown


def test_the_docs_show_tandem_commands() -> None:
    shown = {command.where.split(":")[0] for command in COMMANDS}
    assert {"README.md", "docs/operations.md", "docs/distillation.md", "docs/http-api.md"} <= shown, shown
    assert len(COMMANDS) > 30


def test_inline_code_stays_on_one_line() -> None:
    """Inline commands are read line by line: a code span broken across lines would go unchecked."""
    split = [f"{_rel(page)}:{number}" for page in COMMAND_PAGES
             for number, line in enumerate(_split(page)[1].splitlines(), 1) if line.count("`") % 2]
    assert not split, split


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.where} tandem {' '.join(c.words[:2])}")
def test_command_names_a_subcommand_and_its_flags(command: Command) -> None:
    path, unknown = _resolve(command.words)
    assert not unknown, f"{command.where}: `tandem {' '.join(path)}` has no subcommand {unknown[0]!r}: {command.shown}"
    assert path, f"{command.where}: no subcommand named: {command.shown}"
    offered = set(FLAG.findall(_help(path)))
    used = FLAG.findall(" ".join(command.words))
    missing = sorted(set(used) - offered)
    assert not missing, (f"{command.where}: `tandem {' '.join(path)} --help` lists no {', '.join(missing)}: "
                         f"{command.shown}")


def test_help_lists_every_option() -> None:
    """The help text the flags are checked against is complete: every option of `index build` is in it."""
    build = _subcommands(_subcommands(_cli())["index"])["build"]
    options = {name for param in build.params for name in param.opts + param.secondary_opts if name.startswith("--")}
    assert options <= set(FLAG.findall(_help(("index", "build"))))


def _make_targets() -> set[str]:
    return set(MAKE_TARGET.findall((ROOT / "Makefile").read_text(encoding="utf-8")))


def _make_uses() -> list[tuple[str, str]]:
    uses: list[tuple[str, str]] = []
    for page in PAGES:
        blocks, prose = _split(page)
        lines = [line for block in blocks if block.lang in ("bash", "sh", "shell") for _, line in
                 _shell_lines(block.text)]
        lines += [span for span in INLINE_CODE.findall(prose) if span.startswith("make ")]
        for line in lines:
            words = shlex.split(line, comments=True)
            if words[:1] == ["make"]:
                targets = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
                uses += [(_rel(page), target) for target in targets]
    return uses


def test_make_targets_exist() -> None:
    uses = _make_uses()
    assert ("README.md", "demo") in uses and ("README.md", "test") in uses
    targets = _make_targets()
    missing = sorted({f"{page}: make {target}" for page, target in uses if target not in targets})
    assert not missing, missing


def test_readme_quickstart_is_two_commands() -> None:
    readme = ROOT / "README.md"
    blocks, _ = _split(readme)
    quickstart = next(block for block in blocks if block.lang == "bash")
    assert [shlex.split(line, comments=True) for _, line in _shell_lines(quickstart.text)] == [
        ["make", "demo"], ["make", "test"]]


def test_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8")) <= 10_000


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercased, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def _anchors(page: Path) -> frozenset[str]:
    _, prose = _split(page)
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose.splitlines():
        match = HEADING.match(line)
        if match:
            slug = _slug(match.group(2))
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return frozenset(anchors)


def test_relative_links_resolve() -> None:
    broken: list[str] = []
    for page in PAGES:
        _, prose = _split(page)
        for number, line in enumerate(prose.splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                resolved = (page.parent / file).resolve() if file else page
                where = f"{_rel(page)}:{number} {target}"
                if not resolved.exists():
                    broken.append(f"{where}: no such file")
                elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                    broken.append(f"{where}: no heading #{anchor} in {resolved.name}")
    assert not broken, "\n".join(broken)


def _code_blocks(*langs: str) -> list[Block]:
    return [block for page in PAGES for block in _split(page)[0] if block.lang in langs]


@pytest.mark.parametrize("block", _code_blocks("python"), ids=lambda b: f"{_rel(b.page)}:{b.line}")
def test_python_examples_compile(block: Block) -> None:
    compile(block.text, f"{_rel(block.page)}:{block.line}", "exec")


def test_shell_examples_parse() -> None:
    blocks = _code_blocks("bash", "sh", "shell")
    assert blocks
    for block in blocks:
        result = subprocess.run(["bash", "-n"], input=block.text, text=True, capture_output=True, check=False)
        assert result.returncode == 0, f"{_rel(block.page)}:{block.line}: {result.stderr}"


def test_scripts_the_docs_run_exist() -> None:
    """`python bench/x.py …` and `pytest tests/x.py` name files that are there (bench scripts now run as modules,
    `python -m bench.AREA.SCRIPT`: tests/test_bench.py imports each)."""
    missing: list[str] = []
    for block in _code_blocks("bash", "sh", "shell"):
        if block.page.parent == LAB:
            continue
        for _, line in _shell_lines(block.text):
            words = shlex.split(line, comments=True)
            while words and re.match(r"\w+=", words[0]):  # VAR=value before the command
                words.pop(0)
            if words[:1] in (["python"], ["pytest"]):
                missing += [f"{_rel(block.page)}: {w}" for w in words[1:] if w.endswith(".py") and
                            not (ROOT / w).exists()]
    assert not missing, missing


SOURCE_PATH = re.compile(r"(?<![\w./-])(?:models|service|indexer|tandem|bench|tests|docker)/(?:[\w/]*\w\.py|(?:\w+/)+)")


def test_source_paths_the_docs_name_exist() -> None:
    """Every module or package path the pages name (`models/bundle/version.py`, `models/distill/`) is in the tree."""
    missing = [f"{_rel(page)}: {path}" for page in COMMAND_PAGES for path in SOURCE_PATH.findall(page.read_text())
               if not (ROOT / path).exists()]
    assert not missing, missing


def test_benchmarks_holds_todays_figures_only() -> None:
    """BENCHMARKS.md stays a page of current figures; the long write-ups go to dated records in docs/lab/."""
    size = len((ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert size <= BENCHMARKS_MAX_CHARS, f"docs/BENCHMARKS.md is {size:,} characters; move the write-up to a record"


def test_every_record_is_dated_and_listed() -> None:
    """Each record is named by its UTC date and listed in the notebook's index, so none is lost from view."""
    index = (LAB / "README.md").read_text(encoding="utf-8")
    records = [page for page in RECORDS if page.name != "README.md"]
    assert records
    undated = [page.name for page in records if not re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", page.name)]
    assert not undated, undated
    unlisted = [page.name for page in records if f"]({page.name})" not in index]
    assert not unlisted, f"not listed in docs/lab/README.md: {unlisted}"


def test_bench_scripts_write_a_dated_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bench run writes its own record under the lab folder and leaves every other file alone."""
    from bench.harness import record as benchdoc

    other = tmp_path / "2026-11-24-other.md"
    other.write_text("# kept\n")
    path = benchdoc.publish(tmp_path, "serve-load", "\n# Serving\n\nfigures\n")
    assert path == benchdoc.record_path(tmp_path, "serve-load")
    assert path is not None and re.fullmatch(r"\d{4}-\d{2}-\d{2}-serve-load\.md", path.name)
    assert path.read_text() == "# Serving\n\nfigures\n" and other.read_text() == "# kept\n"
    assert benchdoc.publish(tmp_path / "none", "x", "text", write=False) is None
    assert not (tmp_path / "none").exists()


CODE_DOC_REF = re.compile(r"docs/(decisions\.md#[\w-]+|lab/[\w.-]+\.md)")


def test_code_points_at_decisions_and_records_that_exist() -> None:
    """Code comments that give a reason by an anchor of docs/decisions.md, or by a record of the lab notebook,
    name a heading and a file that exist."""
    broken: list[str] = []
    for folder in ("models", "service", "indexer", "tandem", "bench", "tests"):
        for source in sorted((ROOT / folder).rglob("*.py")):
            for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
                for ref in CODE_DOC_REF.findall(line):
                    file, _, anchor = ref.partition("#")
                    target = ROOT / "docs" / file
                    if not target.exists() or (anchor and anchor not in _anchors(target)):
                        broken.append(f"{_rel(source)}:{number}: docs/{ref}")
    assert not broken, "\n".join(broken)
