"""The ``esi-guard`` command: calibrate a threshold on labelled QA data, evaluate one on another.

Needs the ``cli`` extra. ``commands`` holds the typer app and registers the commands, one
module each: ``calibrate``, ``evaluate``, ``distill`` (an ESI probe from unlabelled
questions), ``env`` (what this machine runs the guard with, for bug reports),
``serve`` (the guard as an OpenAI-compatible server, :mod:`esi_guard.server`) and
``fetch_model`` (a bigger model known by name, from the package registry). What they
share: ``_options`` (their options), ``build`` (the backend, guard and labeller from
those options), ``output`` (stdout, stderr, errors), ``run`` (score a set resumably into
a cache, label it, report it). This folder sits above the guard;
``esi_guard.calibration`` (data, labels, metrics, threshold rules, the threshold file)
sits below it and never imports from here.
"""

from esi_guard.cli.calibrate import SMALL_SET, calibrate
from esi_guard.cli.commands import QUIET, app, main, quiet_third_party
from esi_guard.cli.evaluate import evaluate

__all__ = ["QUIET", "SMALL_SET", "app", "calibrate", "evaluate", "main", "quiet_third_party"]
