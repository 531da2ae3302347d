"""Chat templates for backends that send raw text (the API backend's echo mode).

A template comes from a Jinja source, a tokenizer's ``apply_chat_template``, a local ``.gguf``
file's metadata or a local Hugging Face folder. Jinja runs sandboxed, as in transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from esi_guard.backends._types import Messages
from esi_guard.exceptions import ConfigurationError

__all__ = ["ChatTemplate", "resolve_template"]


def _raise(message: str) -> None:
    raise ConfigurationError(message)


@lru_cache(maxsize=16)
def _compile(source: str) -> Any:
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:  # pragma: no cover - jinja2 ships with the api extra
        msg = "rendering a chat template needs jinja2: pip install 'esi-guard[api]'"
        raise ConfigurationError(msg) from exc
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except Exception as exc:
        msg = f"the chat template does not compile: {exc}"
        raise ConfigurationError(msg) from exc


class ChatTemplate:
    """Renders chat messages into a prompt string ending with the assistant turn's opening.

    Args:
        source: Jinja source of the template, or None when ``render`` is given.
        bos_token: Text of the beginning-of-sequence token, for templates that use it.
        eos_token: Text of the end-of-sequence token, for templates that use it.
        render: A function ``messages -> prompt`` used instead of ``source``.
        origin: Where the template came from, for error messages.
    """

    def __init__(
        self,
        source: str | None = None,
        *,
        bos_token: str = "",
        eos_token: str = "",
        render: Callable[[Messages], str] | None = None,
        origin: str = "chat_template",
    ) -> None:
        if (source is None) == (render is None):
            msg = "ChatTemplate needs exactly one of a Jinja source or a render function"
            raise ConfigurationError(msg)
        self._template = _compile(source) if source is not None else None
        self._render = render
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.origin = origin

    def render(self, messages: Messages) -> str:
        """The prompt for ``messages``, with the generation prompt appended."""
        if self._render is not None:
            return self._render(messages)
        assert self._template is not None
        try:
            text = self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except ConfigurationError:
            raise
        except Exception as exc:
            msg = f"the chat template from {self.origin} failed to render: {exc}"
            raise ConfigurationError(msg) from exc
        return str(text)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatTemplate:
        """Use a tokenizer's ``apply_chat_template`` (e.g. a transformers tokenizer)."""
        if not callable(getattr(tokenizer, "apply_chat_template", None)):
            msg = f"{type(tokenizer).__name__} has no apply_chat_template"
            raise ConfigurationError(msg)
        if getattr(tokenizer, "chat_template", "") is None:
            msg = f"the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template"
            raise ConfigurationError(msg)

        def render(messages: Messages) -> str:
            text = tokenizer.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
            )
            return str(text)

        return cls(render=render, origin=f"tokenizer {type(tokenizer).__name__}")

    @classmethod
    def from_gguf(cls, path: str | Path) -> ChatTemplate:
        """Read the template and BOS/EOS texts from a GGUF file (seconds; cached per file)."""
        stat = Path(path).stat()
        source, bos, eos = _gguf_metadata(str(path), stat.st_size, stat.st_mtime_ns)
        return cls(source, bos_token=bos, eos_token=eos, origin=str(path))


@lru_cache(maxsize=8)
def _gguf_metadata(path: str, size: int, mtime_ns: int) -> tuple[str, str, str]:
    """(chat template, BOS text, EOS text) of a GGUF file."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover - gguf ships with the api extra
        msg = "reading a GGUF chat template needs gguf: pip install 'esi-guard[api]'"
        raise ConfigurationError(msg) from exc
    try:
        fields = GGUFReader(path).fields
    except Exception as exc:
        msg = f"cannot read GGUF metadata from {path}: {exc}"
        raise ConfigurationError(msg) from exc
    if "tokenizer.chat_template" not in fields:
        msg = f"{path} holds no tokenizer.chat_template"
        raise ConfigurationError(msg)
    tokens = fields["tokenizer.ggml.tokens"].contents()

    def token(key: str) -> str:
        field = fields.get(key)
        return str(tokens[int(field.contents())]) if field is not None else ""

    return (
        str(fields["tokenizer.chat_template"].contents()),
        token("tokenizer.ggml.bos_token_id"),
        token("tokenizer.ggml.eos_token_id"),
    )


def resolve_template(
    model: str, chat_template: str | ChatTemplate | None, tokenizer: Any
) -> ChatTemplate | None:
    """The template to use: explicit source, tokenizer, local GGUF or HF folder, else None."""
    if isinstance(chat_template, ChatTemplate):
        return chat_template
    if chat_template is not None:
        return ChatTemplate(chat_template)
    if tokenizer is not None:
        if isinstance(tokenizer, str | Path):
            return _local_template(str(tokenizer), required=True)
        return ChatTemplate.from_tokenizer(tokenizer)
    return _local_template(model, required=False)


def _local_template(name: str, *, required: bool) -> ChatTemplate | None:
    path = Path(name)
    if path.is_file() and path.suffix == ".gguf":
        return ChatTemplate.from_gguf(path)
    hub_id = name.count("/") == 1 and not path.exists()  # e.g. a vLLM model name
    if path.is_dir() or hub_id or required:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            if not required:
                return None
            msg = f"loading the tokenizer {name!r} needs transformers: pip install 'esi-guard[hf]'"
            raise ConfigurationError(msg) from exc
        try:
            tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
        except Exception as exc:
            if not required:
                return None
            msg = f"cannot load the tokenizer {name!r} from local files: {exc}"
            raise ConfigurationError(msg) from exc
        return ChatTemplate.from_tokenizer(tok)
    return None
