"""The ``esi-guard`` command: calibrate a threshold on labelled QA data, evaluate one on another.

Needs the ``cli`` extra. ``commands`` holds the typer app; each command is a module (``calibrate``,
``evaluate``, ``distill``, ``env``, ``serve``, ``fetch_model``), sharing ``_options``, ``build``,
``output`` and ``run``. This folder sits above the guard; ``esi_guard.calibration`` sits below it
and never imports from here.
"""

from esi_guard.cli.calibrate import SMALL_SET, calibrate
from esi_guard.cli.commands import QUIET, app, main, quiet_third_party
from esi_guard.cli.evaluate import evaluate

__all__ = ["QUIET", "SMALL_SET", "app", "calibrate", "evaluate", "main", "quiet_third_party"]
