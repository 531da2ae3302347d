"""No silently ignored settings: every public configuration object refuses unknown keywords."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.runnables import RunnableLambda

from esi_guard import (
    ConfigurationError,
    ESIGuard,
    FakeBackend,
    FixedVariants,
    HFBackend,
    OpenAIBackend,
    Paraphrase,
    ScoringConfig,
    SkipOneChar,
    Typo,
)
from esi_guard.calibration.labels import LLMJudge, Semantic, TokenF1
from esi_guard.interventions import Intervention

FAKE = FakeBackend()
SCORING: dict[str, Any] = {
    "intervention": {}, "n_variants": 10, "top_k": 100, "distance": "hellinger",
    "values": "logits", "approximate": False, "seed": 0, "max_new_tokens": 64,
}  # fmt: skip

CASES: dict[str, tuple[Callable[..., Any], dict[str, Any], str, str]] = {
    "ESIGuard": (ESIGuard, {"backend": FAKE, "threshold": 0.3}, "actoin", "action"),
    "SkipOneChar": (SkipOneChar, {}, "min_char", "min_chars"),
    "Typo": (Typo, {}, "pp", "p"),
    "Paraphrase": (Paraphrase, {"llm": RunnableLambda(str)}, "max_call", "max_calls"),
    "FixedVariants": (FixedVariants, {"paraphrases": {}}, "strcit", "strict"),
    "FakeBackend": (FakeBackend, {}, "default_anwser", "default_answer"),
    "HFBackend": (HFBackend, {"model": None, "tokenizer": None}, "model_di", "model_id"),
    "OpenAIBackend": (OpenAIBackend, {"model": "m"}, "base_ur", "base_url"),
    "ScoringConfig": (ScoringConfig, SCORING, "n_variant", "n_variants"),
    "TokenF1": (TokenF1, {}, "treshold", "threshold"),
    "Semantic": (Semantic, {}, "devise", "device"),
    "LLMJudge": (LLMJudge, {"llm": FAKE}, "promt", "prompt"),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_an_unknown_keyword_is_refused_with_the_nearest_valid_one(name: str) -> None:
    make, good, typo, meant = CASES[name]
    with pytest.raises(
        ConfigurationError, match=rf"unknown keyword {typo!r}; did you mean {meant!r}"
    ):
        make(**good, **{typo: 1})


def test_the_guard_that_was_meant_to_abstain_never_silently_flags() -> None:
    with pytest.raises(ConfigurationError, match="did you mean 'action'"):
        ESIGuard(backend=FAKE, threshold=0.3, actoin="abstain")


def test_every_public_intervention_is_covered() -> None:
    public = {cls.__name__ for cls in Intervention.__subclasses__()} | {
        cls.__name__ for base in Intervention.__subclasses__() for cls in base.__subclasses__()
    }
    assert {n for n in public if not n.startswith("_")} <= set(CASES)
