"""The ``esi-guard`` command: calibrate a threshold on labelled QA data, evaluate one on another.

Needs the ``cli`` extra. ``commands`` holds the typer app and ``calibrate``/``evaluate``;
``distill`` (an ESI probe from unlabelled questions), ``env`` (what this machine runs the
guard with, for bug reports) and ``serve`` (the guard as an
OpenAI-compatible server, :mod:`esi_guard.serve`) register themselves on it; ``_options``
their shared options and ``_run`` what they share (score a set resumably, label it, report
it); ``runner`` scores examples with a guard into a resumable cache. This folder sits above
the guard; ``esi_guard.calibration`` (data, labels, metrics, threshold rules, the threshold
file) sits below it and never imports from here.
"""

from esi_guard.cli import distill as _distill  # noqa: F401 - registers `esi-guard distill`
from esi_guard.cli import env as _env  # noqa: F401 - registers `esi-guard env`
from esi_guard.cli import serve as _serve  # noqa: F401 - registers `esi-guard serve`
from esi_guard.cli.commands import (
    QUIET,
    SMALL_SET,
    app,
    calibrate,
    evaluate,
    main,
    quiet_third_party,
)

__all__ = ["QUIET", "SMALL_SET", "app", "calibrate", "evaluate", "main", "quiet_third_party"]
