"""Calibration below the guard: QA data, labels, metrics, threshold rules and the threshold file.

``data`` loads labelled QA sets, ``prompts`` builds a run's prompts, ``labels`` decides which
answers are wrong, ``metrics`` and ``thresholds`` measure scores and choose a threshold,
``combining`` fits the combined score, ``file`` is the threshold file a guard loads, and
``plot`` draws a run. Nothing here imports the guard, LangChain or the CLI: scoring a set
with a guard is ``esi_guard.cli.runner``'s job. Import the modules themselves; this package
re-exports nothing.
"""
