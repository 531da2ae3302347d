"""Calibration below the guard: QA data, labels, metrics, threshold rules and the threshold file.

Nothing here imports the guard, LangChain or the CLI (scoring a set is ``esi_guard.cli.run``'s
job). Import the modules, each of which says what it is for; this package re-exports nothing.
"""
