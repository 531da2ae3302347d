"""Calibration below the guard: QA data, labels, metrics, threshold rules and the threshold file.

``data`` loads labelled QA sets, ``prompts`` builds a run's prompts, ``labels`` decides which
answers are wrong, ``metrics`` and ``thresholds`` measure scores and choose a threshold,
``combined_fit`` fits the combined score, ``calibrate_combined`` fits it on a run for
``esi-guard calibrate --score combined``, ``cascade_fit`` fits the ESI probe and the
cascade's band (both through ``probe_search``), ``file`` is the threshold file a guard loads, and
``plot`` draws a run. Nothing here imports the guard, LangChain or the CLI: scoring a set
with a guard is ``esi_guard.cli.run``'s job. Import the modules themselves; this package
re-exports nothing.
"""
