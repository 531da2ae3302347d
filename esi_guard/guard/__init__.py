"""ESIGuard, the guarded chat model, and everything LangChain about it.

``chat_model`` holds :class:`ESIGuard` (fields, validation, the chat-model surface);
the private modules are its plumbing: ``_inputs`` (what a chain hands the guard),
``_templates`` (``with_prompt``), ``_batching`` (``batch`` batched through the backend),
``_live`` (``stream``), ``_messages`` (results as messages), ``_tracing`` (the step hook:
child runs), ``_config`` (settings from a threshold file).

Besides the guard, this package names the pieces it is built from, for code that times
or studies its steps one by one (the benchmarks): the :class:`Pipeline` it drives and its
decision settings (:class:`Rule`), the :class:`Work` a step asks for, the
:class:`Item` each prompt travels as, a prompt rendered the way ``with_prompt`` renders
it (:class:`TemplatedPrompt`) and LangChain messages as the backends' chat messages
(:func:`chat_messages`). They are not part of ``esi_guard``'s top-level API and may change
between minor versions.
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
