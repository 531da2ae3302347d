"""A run: a QA set scored by a guard into a resumable JSONL cache, labelled and reported.

The cache's first line, its header (:class:`RunHeader`), records what the run is: what was
asked for (``request``: the command's model and scoring options, its prompts), the
dataset hash, and what the loaded model turned out to be (``model``, ``engine``,
``model_sha256``, the full ``scoring`` configuration). A rerun with the same cache skips
the examples already there; one that finds every example in a cache written for the same
request and data needs no model at all, as the header says everything a threshold file
records about the model. Labels are written into the records after each run: ``labels``
maps each label method's name to right (true) or wrong (false), so the labels a threshold
rests on can be audited beside the answers.

By job: :mod:`.cache` (the header and the file), :mod:`.score` (a guard's results into
it, through ``ESIGuard.assess``), :mod:`.labelled` (load, score, label, report).
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
