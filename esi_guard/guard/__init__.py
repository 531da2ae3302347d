"""ESIGuard, the guarded chat model, and everything LangChain about it.

``chat_model`` holds :class:`ESIGuard`; the private modules are its plumbing. Also named here,
for code that studies the steps one by one (the benchmarks): :class:`Pipeline`, :class:`Rule`,
:class:`Work`, :class:`Item`, :class:`TemplatedPrompt` and :func:`chat_messages`. They are not
part of ``esi_guard``'s top-level API and may change between minor versions.
"""

from esi_guard._pipeline import GuardedPrompt, Item, Pipeline, Rule, Work
from esi_guard.guard._inputs import chat_messages
from esi_guard.guard._templates import TemplatedPrompt
from esi_guard.guard.chat_model import DEFAULT_ABSTAIN_MESSAGE, ESIGuard, GuardInput

__all__ = [
    "DEFAULT_ABSTAIN_MESSAGE",
    "ESIGuard",
    "GuardInput",
    "GuardedPrompt",
    "Item",
    "Pipeline",
    "Rule",
    "TemplatedPrompt",
    "Work",
    "chat_messages",
]
