"""Every ``esi-guard`` command the README and the docs show names options that exist.

A user copies these lines as they are; an option renamed in the CLI but not in the docs
fails at once for them (``No such option``). Parsed, not run: each line's subcommand and
every ``--option`` it passes are looked up on the CLI itself.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

typer = pytest.importorskip("typer")

ROOT = Path(__file__).resolve().parents[3]
FENCE = re.compile(r"^\s*```(\w*)")


def documented_commands() -> list[tuple[str, str]]:
    """``(file, line)`` for each ``esi-guard ...`` line in a code block of the docs."""
    found: list[tuple[str, str]] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        language: str | None = None  # inside a fenced block: its language
        text = re.sub(r"\\\n\s*", " ", path.read_text(encoding="utf-8"))
        for line in text.splitlines():
            fence = FENCE.match(line)
            if fence:
                language = fence.group(1) if language is None else None
                continue
            line = line.strip().removeprefix("$ ")
            if language in ("bash", "sh", "console", "") and line.startswith("esi-guard "):
                found.append((path.name, line.split(" #")[0]))
    return found


def test_the_docs_show_commands() -> None:
    subcommands = {shlex.split(line)[1] for _, line in documented_commands()}
    assert {"calibrate", "distill", "evaluate", "serve"} <= subcommands, subcommands


@pytest.mark.parametrize(("where", "line"), documented_commands())
def test_a_documented_command_names_options_that_exist(where: str, line: str) -> None:
    from esi_guard.cli import app

    group = typer.main.get_command(app)
    words = shlex.split(line.replace("$(", "").replace(")", ""))
    command = group.commands.get(words[1])  # type: ignore[attr-defined]
    assert command is not None, f"{where}: no subcommand {words[1]!r} in {line!r}"
    known = {option for param in command.params for option in param.opts + param.secondary_opts}
    unknown = [
        word.split("=")[0]
        for word in words[2:]
        if word.startswith("--") and word.split("=")[0] not in known
    ]
    assert not unknown, f"{where}: {line!r} passes {unknown}, unknown to esi-guard {words[1]}"
