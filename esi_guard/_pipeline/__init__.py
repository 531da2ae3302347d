"""The scoring pipeline: prompts in, decided results out, with no LangChain in the folder.

``steps`` holds :class:`Pipeline` (the order of the steps, once, as a sans-IO generator,
the drivers that do its work, and per-item failures); ``decide`` an answer's decision
(what to force for each item, the forced rows made results, the rule); ``items`` what
travels through it; ``by_sentence`` the stream scored sentence by sentence. The guard
(:mod:`esi_guard.guard`) drives it; nothing here imports the guard.
"""

from esi_guard._pipeline.decide import Rule, acted, untrusted
from esi_guard._pipeline.items import GuardedPrompt, Item, Outcome, Templated
from esi_guard._pipeline.steps import AsyncStepHook, Pipeline, Step, StepHook, Work

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
    "Work",
    "acted",
    "untrusted",
]
