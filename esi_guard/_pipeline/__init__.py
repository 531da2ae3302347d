"""The scoring pipeline: prompts in, decided results out, with no LangChain in the folder.

``steps`` holds :class:`Pipeline` (the order of the steps, once, and the steps); the
score step's pure part is ``assess`` (what to force for each item, and the forced
distributions made results);
``decide`` holds the decision rule, ``items`` what travels through it, ``shield``
per-item failures. The guard
(:mod:`esi_guard.guard`) drives it; nothing here imports the guard.
"""

from esi_guard._pipeline.decide import Rule, acted, untrusted
from esi_guard._pipeline.items import GuardedPrompt, Item, Outcome, Templated
from esi_guard._pipeline.steps import AsyncStepHook, Pipeline, Step, StepHook

__all__ = [
    "AsyncStepHook",
    "GuardedPrompt",
    "Item",
    "Outcome",
    "Pipeline",
    "Rule",
    "Step",
    "StepHook",
    "Templated",
    "acted",
    "untrusted",
]
