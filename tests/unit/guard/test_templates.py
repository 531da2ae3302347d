"""Chat templates for the API backend's echo mode: sources, rendering, resolution order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from esi_guard import ConfigurationError
from esi_guard.backends import embedded_gguf
from esi_guard.backends._template import ChatTemplate, resolve_template

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
CHATML = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_jinja_source_renders_with_the_generation_prompt_and_bos() -> None:
    text = ChatTemplate(CHATML, bos_token="<s>").render(MESSAGES)  # type: ignore[arg-type]
    assert text == (
        "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_templates_fail_with_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    strict = ChatTemplate("{{ raise_exception('system messages are not supported') }}")
    with pytest.raises(ConfigurationError, match="not supported"):
        strict.render(MESSAGES)  # type: ignore[arg-type]
    sandboxed = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ConfigurationError, match="failed to render"):
        sandboxed.render(MESSAGES)  # type: ignore[arg-type]


def test_the_embedded_gguf_carries_the_smollm2_template() -> None:
    template = ChatTemplate.from_gguf(embedded_gguf())
    text = template.render([{"role": "user", "content": "Hi?"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n")


class StubTokenizer:
    chat_template = "stub"

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        assert kwargs == {"tokenize": False, "add_generation_prompt": True}
        return "|".join(m["content"] for m in messages) + "|>"


def test_resolution_order_source_then_tokenizer_then_local_file(tmp_path: Path) -> None:
    gguf = str(embedded_gguf())
    assert resolve_template(gguf, "{{ 'x' }}", StubTokenizer()).render(MESSAGES) == "x"  # type: ignore[union-attr, arg-type]
    by_tokenizer = resolve_template(gguf, None, StubTokenizer())
    assert by_tokenizer is not None and by_tokenizer.render(MESSAGES) == "Be brief.|Hi?|>"  # type: ignore[arg-type]
    by_file = resolve_template(gguf, None, None)
    assert by_file is not None and by_file.origin == gguf
    assert resolve_template("gpt-4o-mini", None, None) is None  # a remote name: nothing local
    with pytest.raises(ConfigurationError, match="apply_chat_template"):
        resolve_template("m", None, object())
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"not a gguf file")
    with pytest.raises(ConfigurationError, match="GGUF metadata"):
        resolve_template(str(not_gguf), None, None)
