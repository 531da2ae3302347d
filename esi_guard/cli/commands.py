"""The ``esi-guard`` app: its help, ``--version``, and its commands, one module each.

Needs the ``cli`` extra and a backend's (``hf``/``llamacpp`` local, ``api`` for servers). Results
go to stdout; errors, warnings, progress to stderr (an error exits 2, an unmet risk target 1).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Annotated, TextIO

import typer

from esi_guard import __version__
from esi_guard.cli.calibrate import calibrate
from esi_guard.cli.distill import distill
from esi_guard.cli.env import env
from esi_guard.cli.evaluate import evaluate
from esi_guard.cli.fetch_model import fetch_model
from esi_guard.cli.output import warn
from esi_guard.cli.serve import serve

__all__ = ["HELP", "QUIET", "app", "main", "one_line_warnings", "quiet_third_party"]

HELP = (
    "Guard LLM answers with the ESI uncertainty score. calibrate scores a labelled QA set "
    "and writes a threshold file; evaluate measures one on another set; distill fits an "
    "ESI probe on unlabelled questions; serve runs the guard as an OpenAI-compatible "
    "server; env reports this machine's setup for bug reports; fetch-model downloads a "
    "bigger model known by name. Run esi-guard COMMAND --help for a command's options."
)
"""The top-level help: plain text (no markup), naming every command."""

app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP)
# the order --help lists them in
for command in (calibrate, evaluate, distill, env, serve, fetch_model):
    app.command()(command)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"esi-guard {__version__}")
        raise typer.Exit


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", is_eager=True,
                     callback=_version, metavar=""),  # a flag: no "<bool>" in the help
    ] = False,
) -> None:  # fmt: skip
    """The options before a command (the help is :data:`HELP`)."""


QUIET = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
"""Environment that silences tqdm's, the hub's and transformers' progress bars: we draw our own."""


def quiet_third_party() -> None:
    """Silence other libraries' progress bars, unless the environment already decides."""
    for name, value in QUIET.items():
        os.environ.setdefault(name, value)
    if "transformers" in sys.modules:  # imported already: its switch was read
        from transformers.utils import logging

        logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def _show(
    message: Warning | str, category: type[Warning], filename: str, lineno: int,
    file: TextIO | None = None, line: str | None = None,
) -> None:  # fmt: skip
    warn(f"{category.__name__}: {message}")


def one_line_warnings() -> None:
    """Print a library's Python warning as the command's own one-line ``warning:`` on stderr."""
    warnings.showwarning = _show


def main() -> None:
    """Entry point of the ``esi-guard`` command."""
    quiet_third_party()
    one_line_warnings()
    app()
