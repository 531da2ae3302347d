"""The chat template a GGUF model's prompts are rendered with, and the tokens of its text.

The template is the caller's, else the GGUF's ``tokenizer.chat_template``; a base model, whose file
holds none, takes :data:`COMPLETION_TEMPLATE` (``chat_template="completion"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from esi_guard.backends._template import ChatTemplate
from esi_guard.exceptions import ConfigurationError

__all__ = ["COMPLETION_TEMPLATE", "Tokens", "gguf_template"]

COMPLETION_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n\n{% endfor %}Answer:"
"""``chat_template="completion"``, for base models: each message, a blank line, then ``Answer:``."""


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


class Tokens:
    """A loaded ``Llama``'s text as token ids and back, and its end-of-generation tokens."""

    def __init__(self, llama: Any, llama_cpp: Any) -> None:
        self.llama = llama
        self._vocab = llama_cpp.llama_model_get_vocab(llama._model.model)
        self._is_eog = llama_cpp.llama_vocab_is_eog

    def prompt(self, text: str) -> list[int]:
        """Token ids of a rendered prompt (BOS put first if the model wants one the text lacks)."""
        tokens = self.tokenize(text, special=True)
        model = self.llama._model
        if model.add_bos_token() and model.token_bos() >= 0 and tokens[:1] != [model.token_bos()]:
            tokens.insert(0, model.token_bos())
        return tokens

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Token ids of ``text``, no beginning-of-sequence token added."""
        return list(self.llama.tokenize(text.encode("utf-8"), add_bos=False, special=special))

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` (bytes that are not whole UTF-8 characters dropped)."""
        return bytes(self.llama.detokenize(list(tokens))).decode("utf-8", errors="ignore")

    def is_end(self, token: int) -> bool:
        """Whether ``token`` ends a generation (end of sequence, end of turn, ...)."""
        return bool(self._is_eog(self._vocab, token))
