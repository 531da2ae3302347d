"""The hidden-state probe (issue 37): ``collect`` runs, ``report`` every method on them.

``collect`` records a run's answers, states, ESI, signals and labels on llama.cpp;
``report`` scores every method on them out of fold.

``python -m benchmarks.probe collect|report`` (:mod:`benchmarks.probe.__main__`);
:mod:`~benchmarks.probe.collect` and :mod:`~benchmarks.probe.report` both read runs through
:mod:`~benchmarks.probe.data` and never import each other.
"""
