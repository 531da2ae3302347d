"""The chat template a GGUF model's prompts are rendered with.

The template comes from the caller, else from the GGUF's metadata
(``tokenizer.chat_template``); a base model, whose file holds none, takes
:data:`COMPLETION_TEMPLATE` (``chat_template="completion"``).
"""

from __future__ import annotations

from typing import Any

from esi_guard.backends._template import ChatTemplate
from esi_guard.exceptions import ConfigurationError

__all__ = ["COMPLETION_TEMPLATE", "gguf_template"]

COMPLETION_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n\n{% endfor %}Answer:"
"""``chat_template="completion"``: for base models, whose GGUF holds no chat template.

Each message's text, a blank line after each, then ``Answer:`` for the model to go on.
"""


def gguf_template(
    llama: Any, chat_template: str | ChatTemplate | None, origin: str
) -> ChatTemplate:
    """The template for a loaded ``llama_cpp.Llama``: ``chat_template``, else the file's.

    Raises:
        ConfigurationError: Neither is given (``origin`` names the model in the message).
    """
    if isinstance(chat_template, ChatTemplate):
        return chat_template
    model = llama._model
    bos, eos = model.token_bos(), model.token_eos()
    bos_text = str(model.token_get_text(bos)) if bos >= 0 else ""
    eos_text = str(model.token_get_text(eos)) if eos >= 0 else ""
    if chat_template == "completion":
        chat_template = COMPLETION_TEMPLATE
    source = chat_template or llama.metadata.get("tokenizer.chat_template")
    if not source:
        msg = (
            f"{origin} holds no chat template (a base model?); pass chat_template='...' "
            "(a Jinja template), or chat_template='completion' for plain text ending in "
            "'Answer:'"
        )
        raise ConfigurationError(msg)
    return ChatTemplate(str(source), bos_token=bos_text, eos_token=eos_text, origin=origin)
