"""A GGUF file's reading kept for the next load: written whole or not at all, within its limit.

On a tiny random Llama the test builds; the real embedded file's kept reading, compared with
a fresh one bit for bit, is in tests/integration/test_embedded_model.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from esi_guard.backends.hf import _converted
from esi_guard.backends.hf._converted import keep, kept_folder, read_kept

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


class SavedTokenizer:
    """Stands in for a tokenizer: it only saves itself."""

    def save_pretrained(self, folder: Path) -> None:
        Path(folder, "tokenizer.json").write_text("{}")


def tiny() -> Any:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ESI_GUARD_CACHE", str(tmp_path))
    return tmp_path


def test_the_folder_is_named_by_digest_and_dtype(own_cache: Path) -> None:
    folder = kept_folder("ab" * 32, torch.bfloat16)
    assert folder == own_cache / "converted" / f"{'ab' * 12}-bfloat16"
    assert kept_folder("ab" * 32, "auto").name.endswith("-auto")


def test_a_kept_reading_is_whole_and_the_model_is_left_as_it_was(own_cache: Path) -> None:
    model = tiny()
    model.config.quantization_config = {"quant_method": "gguf"}
    folder = kept_folder("cd" * 32, "auto")
    keep(folder, SavedTokenizer(), model)
    assert {p.name for p in folder.iterdir()} >= {
        "config.json", "esi_guard-converted", "model.safetensors", "tokenizer.json"
    }  # fmt: skip
    assert "quantization_config" not in (folder / "config.json").read_text()
    assert model.config.quantization_config == {"quant_method": "gguf"}
    assert not [p for p in folder.parent.iterdir() if p.name.endswith(".partial")]


def test_a_folder_without_its_last_file_is_not_read(own_cache: Path) -> None:
    folder = kept_folder("ef" * 32, "auto")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # a process stopped before it finished
    assert read_kept(folder, None) is None


def test_an_unreadable_kept_folder_is_dropped_and_read_again(own_cache: Path) -> None:
    folder = kept_folder("12" * 32, "auto")
    keep(folder, SavedTokenizer(), tiny())
    (folder / "config.json").write_text("not json")
    assert read_kept(folder, None) is None
    assert not folder.exists()


def test_the_least_recently_used_go_first_and_a_model_over_the_limit_is_not_kept(
    own_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = sum(p.numel() * p.element_size() for p in tiny().parameters())
    monkeypatch.setattr(_converted, "CONVERTED_LIMIT", int(2.5 * size))
    old, recent, new = (kept_folder(c * 64, "auto") for c in "abc")
    keep(old, SavedTokenizer(), tiny())
    keep(recent, SavedTokenizer(), tiny())
    os.utime(old, (1, 1))  # used long ago
    keep(new, SavedTokenizer(), tiny())
    assert not old.exists() and recent.is_dir() and new.is_dir()
    monkeypatch.setattr(_converted, "CONVERTED_LIMIT", size // 2)
    keep(kept_folder("d" * 64, "auto"), SavedTokenizer(), tiny())
    assert not kept_folder("d" * 64, "auto").exists()


def test_a_disk_that_refuses_costs_the_next_load_not_this_one(
    own_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    model = tiny()
    monkeypatch.setattr(model, "save_pretrained", refuse)
    folder = kept_folder("34" * 32, "auto")
    keep(folder, SavedTokenizer(), model)  # no error
    assert not folder.exists()
    assert not [p for p in folder.parent.iterdir() if p.name.endswith(".partial")]


def test_a_tokenizer_that_cannot_save_itself_leaves_nothing_kept(own_cache: Path) -> None:
    folder = kept_folder("56" * 32, "auto")
    keep(folder, object(), tiny())  # a custom tokenizer without save_pretrained: no error
    assert not folder.exists()
    assert not [p for p in folder.parent.iterdir() if p.name.endswith(".partial")]
