"""A run: a QA set scored by a guard into a resumable JSONL cache, labelled and reported.

The cache's header (:class:`RunHeader`) records what was asked and what the model turned out to
be: a rerun skips the examples already there, and a complete cache of the same request and data
needs no model. Each record's ``labels`` maps a label method to right (true) or wrong (false), to
audit beside the answers. By job: :mod:`.cache`, :mod:`.score` (``assess``), :mod:`.labelled`.
"""

from esi_guard.cli.run.cache import CACHE_KIND, CACHE_VERSION, RunHeader
from esi_guard.cli.run.labelled import Run, Source, metrics_table, report, score_run, summary

__all__ = [
    "CACHE_KIND",
    "CACHE_VERSION",
    "Run",
    "RunHeader",
    "Source",
    "metrics_table",
    "report",
    "score_run",
    "summary",
]
