"""``esi-guard`` itself: its help names every command in plain text, and ``--version``."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from esi_guard import __version__
from esi_guard.cli import commands as cli_module


def test_the_help_is_plain_text_naming_every_command() -> None:
    result = CliRunner().invoke(cli_module.app, ["--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "``" not in text and ":mod:" not in text  # no reStructuredText
    assert " ".join(cli_module.HELP.split()) in text
    group = typer.main.get_command(cli_module.app)
    names = set(group.commands)  # type: ignore[attr-defined]
    assert {"calibrate", "evaluate", "distill", "serve", "env"} <= names
    for name in names:
        assert f"{name} " in cli_module.HELP, f"the help does not name {name}"


def test_version_prints_the_package_version() -> None:
    result = CliRunner().invoke(cli_module.app, ["--version"])
    assert result.exit_code == 0 and result.output == f"esi-guard {__version__}\n"


def test_version_is_a_flag_in_the_help() -> None:
    result = CliRunner().invoke(cli_module.app, ["--help"])
    (line,) = [line for line in result.output.splitlines() if "--version" in line]
    assert "<bool>" not in line and "Print the version" in line
