"""ESIGuard, the guarded chat model, and everything LangChain about it.

``chat_model`` holds :class:`ESIGuard` (fields, validation, the chat-model surface);
the private modules are its plumbing: ``_inputs`` (what a chain hands the guard),
``_templates`` (``with_prompt``), ``_batching`` (``batch`` batched through the backend),
``_live`` (``stream``), ``_messages`` (results as messages), ``_tracing`` (the step hook:
child runs), ``_config`` (settings from a threshold file).
"""

from esi_guard.guard.chat_model import DEFAULT_ABSTAIN_MESSAGE, ESIGuard, GuardInput

__all__ = ["DEFAULT_ABSTAIN_MESSAGE", "ESIGuard", "GuardInput"]
