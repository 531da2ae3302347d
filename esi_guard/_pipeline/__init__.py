"""The scoring pipeline, with no LangChain: prompts in, decided results out.

``steps``: :class:`Pipeline`, the step order; ``decide``: the rule; ``items``: what travels;
``by_sentence``: scored streaming. The guard (:mod:`esi_guard.guard`) drives it; none imports it.
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
