"""Interventions: seeded, faithful to the paper's definition, never touching protected text."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from esi_guard import ConfigurationError, FixedVariants, InputError, Paraphrase, SkipOneChar, Typo
from esi_guard.interventions import parse_rephrasings, rebuild_intervention

QUESTION = "For which team did Babe Ruth blast his last Major League home run?"
WORD = re.compile(r"[^\W\d_]+")


def words(text: str) -> list[str]:
    return WORD.findall(text)


def letters(text: str) -> list[list[str]]:
    """Each word's characters: a letter with the combining marks after it (as SOC reads)."""
    out: list[list[str]] = []
    current: list[str] = []
    for char in text:
        if char.isalpha():
            current.append(char)
        elif current and unicodedata.category(char)[0] == "M":
            current[-1] += char
        elif current:
            out, current = [*out, current], []
    return [*out, current] if current else out


def outside(text: str) -> str:
    """``text`` without its words (letters and their marks)."""
    kept, in_word = [], False
    for char in text:
        in_word = char.isalpha() or (in_word and unicodedata.category(char)[0] == "M")
        if not in_word:
            kept.append(char)
    return "".join(kept)


def test_soc_is_reproducible_per_seed_and_varies_across_seeds() -> None:
    soc = SkipOneChar()
    assert soc.variants(QUESTION, 10, seed=3) == soc.variants(QUESTION, 10, seed=3)
    assert soc.variants(QUESTION, 10, seed=3) != soc.variants(QUESTION, 10, seed=4)


def test_soc_variants_do_not_depend_on_batch_company() -> None:
    soc = SkipOneChar()
    alone = soc.batch_variants([QUESTION], 5)
    together = soc.batch_variants(["Where is Paris located today?", QUESTION], 5)
    assert together[1] == alone[0]


def test_soc_p_zero_is_the_identity() -> None:
    assert SkipOneChar(p=0.0, distinct=False).variants(QUESTION, 5) == [QUESTION] * 5
    assert SkipOneChar(p=0.0).variants(QUESTION, 5) == []  # no variant differs from it


def test_soc_deletes_one_character_after_the_first_m_star_of_each_edited_word() -> None:
    soc = SkipOneChar(p=1.0, min_chars=3)
    (variant,) = soc.variants(QUESTION, 1)
    for before, after in zip(words(QUESTION), words(variant), strict=True):
        if len(before) <= 3:
            assert after == before
        else:
            assert len(after) == len(before) - 1
            assert after[:3] == before[:3]
            assert any(before[:i] + before[i + 1 :] == after for i in range(3, len(before)))


def test_soc_leaves_digits_punctuation_and_short_words() -> None:
    question = "Was it 1945, or 1946? Yes: no."
    assert SkipOneChar(p=1.0, distinct=False).variants(question, 3) == [question] * 3
    assert SkipOneChar(p=1.0).variants(question, 3) == []


def test_soc_variants_differ_from_the_question_and_from_each_other() -> None:
    for question in (QUESTION, "What is the capital of France?"):
        variants = SkipOneChar().variants(question, 10)
        assert len(variants) == 10 and len(set(variants)) == 10 and question not in variants
    # Independent draws (the paper's text taken literally) repeat on a short question.
    draws = SkipOneChar(distinct=False).variants("What is the capital of France?", 10)
    assert len(set(draws)) < 10


def test_soc_gives_fewer_variants_when_the_question_allows_no_more() -> None:
    # Two eligible words, one deletion place each: three variants exist, no more.
    assert sorted(SkipOneChar().variants("Name a lake.", 10)) == [
        "Nam a lak.", "Nam a lake.", "Name a lak.",
    ]  # fmt: skip


def test_soc_exact_edits_ceil_p_times_the_eligible_words() -> None:
    question = "Which famous painter created the artwork called Starry Night during summer?"
    eligible = [w for w in words(question) if len(w) > 3]  # 10 words
    for variant in SkipOneChar(p=0.3, words="exact").variants(question, 10):
        edited = sum(a != b for a, b in zip(words(question), words(variant), strict=True))
        assert edited == math.ceil(0.3 * len(eligible)) == 3
    with pytest.raises(ConfigurationError, match="words must be"):
        SkipOneChar(words="some")  # type: ignore[arg-type]


def test_soc_with_repeats_allowed_gives_the_variants_it_always_gave() -> None:
    # Pinned: threshold files calibrated before ``distinct`` existed rebuild this way.
    assert SkipOneChar(distinct=False).variants("What is the capital of France?", 10, seed=0) == [
        "What is the capita of Franc?",
        "What is the capital of France?",
        "What is the capital of France?",
        "What is the capital of France?",
        "What is the capital of Frace?",
        "Wha is the capital of Franc?",
        "Wha is the capital of France?",
        "What is the capital of Frane?",
        "Wha is the capita of France?",
        "What is the capital of Franc?",
    ]
    old = rebuild_intervention({"name": "skip_one_char", "p": 0.3, "min_chars": 3})
    assert old == SkipOneChar(distinct=False)
    new = SkipOneChar(words="exact")
    assert rebuild_intervention(new.describe()) == new


def test_soc_edits_about_p_of_eligible_words() -> None:
    text = " ".join(["elephant"] * 2000)
    (variant,) = SkipOneChar(p=0.3).variants(text, 1)
    share = sum(w != "elephant" for w in variant.split()) / 2000
    assert 0.26 < share < 0.34


def test_typo_replaces_with_a_keyboard_neighbour_and_keeps_length() -> None:
    (variant,) = Typo(p=1.0).variants("Question", 1)
    assert len(variant) == len("Question") and variant[:3] == "Que" and variant != "Question"


@pytest.mark.parametrize("kwargs", [{"p": 1.5}, {"p": -0.1}, {"min_chars": 0}])
def test_invalid_parameters_are_named(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match=next(iter(kwargs))):
        SkipOneChar(**kwargs)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=120), st.integers(0, 2**32), st.integers(1, 6))
def test_character_edits_never_touch_protected_text(text: str, seed: int, min_chars: int) -> None:
    for intervention in (SkipOneChar(p=0.7, min_chars=min_chars), Typo(p=0.7, min_chars=min_chars)):
        variants = intervention.variants(text, 3, seed=seed)
        assert variants == intervention.variants(text, 3, seed=seed)
        for variant in variants:
            # Everything outside words is unchanged, and so are short words and prefixes.
            assert outside(variant) == outside(text)
            for before, after in zip(letters(text), letters(variant), strict=True):
                assert after[:min_chars] == before[:min_chars]
                if len(before) <= min_chars:
                    assert after == before


REPLY = """Rephrase 1: Which team was Babe Ruth playing for when he hit his final MLB home run?
Rephrase 2: For which team did Babe Ruth blast his last Major League home run?
Rephrase 3: Which team was Babe Ruth playing for when he hit his final MLB home run?
Rephrase 4: What team did Babe Ruth hit his last major league homer for?"""


def test_parse_rephrasings_reads_numbered_lines() -> None:
    assert len(parse_rephrasings(REPLY)) == 4
    assert parse_rephrasings("**Rephrase 1:** Hello there?") == ["Hello there?"]


def test_paraphrase_deduplicates_drops_the_original_and_tops_up_with_soc() -> None:
    llm = FakeListChatModel(responses=[REPLY, REPLY, REPLY])
    variants = Paraphrase(llm=llm).variants(QUESTION, 5)
    assert variants[:2] == [
        "Which team was Babe Ruth playing for when he hit his final MLB home run?",
        "What team did Babe Ruth hit his last major league homer for?",
    ]
    assert variants[2:] == SkipOneChar().variants(QUESTION, 3)
    # A second call added nothing new, so the third was never made.
    assert llm.i == 2


def test_paraphrase_sends_the_papers_prompt() -> None:
    llm = FakeListChatModel(responses=[REPLY])
    Paraphrase(llm=llm, max_calls=1).variants(QUESTION, 1)
    with pytest.raises(ConfigurationError, match="query"):
        Paraphrase(llm=llm, prompt="no placeholder")


async def test_paraphrase_async_matches_sync() -> None:
    sync = Paraphrase(llm=FakeListChatModel(responses=[REPLY] * 3)).batch_variants([QUESTION], 3)
    async_ = await Paraphrase(llm=FakeListChatModel(responses=[REPLY] * 3)).abatch_variants(
        [QUESTION], 3
    )
    assert sync == async_


def test_fixed_variants_lookup_sampling_and_fill(tmp_path: Path) -> None:
    path = tmp_path / "para.jsonl"
    rows = [{"query": QUESTION, "paraphrases": ["A one?", "B two?", "C three?", "A one?"]}]
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    fixed = FixedVariants.from_jsonl(path)
    few = fixed.variants(QUESTION, 2, seed=1)
    assert len(few) == 2 and set(few) <= {"A one?", "B two?", "C three?"}
    many = fixed.variants("  " + QUESTION.upper() + " ", 5)
    assert many[:3] == ["A one?", "B two?", "C three?"]
    assert len(many) == 5
    assert fixed.variants("Unknown question here?", 2) == SkipOneChar().variants(
        "Unknown question here?", 2
    )
    with pytest.raises(InputError, match="no precomputed paraphrases"):
        FixedVariants({}, strict=True).variants("Unknown question here?", 2)


def test_fixed_variants_reads_the_shared_sciq_paraphrases(shared_data: Path) -> None:
    fixed = FixedVariants.from_jsonl(shared_data / "sciq" / "paraphrase.jsonl")
    question = next(iter(fixed.paraphrases))
    variants = fixed.variants(question, 5)
    assert len(variants) == 5 and question not in variants


def test_paraphrase_reads_text_blocks_and_skips_reasoning_blocks() -> None:
    from langchain_core.messages import AIMessage
    from langchain_core.runnables import RunnableLambda

    reply = AIMessage(
        content=[{"type": "reasoning", "reasoning": "Rephrase 9: not this one?"},
                 {"type": "text", "text": "Rephrase 1: Which team did Babe Ruth last homer for?"}]
    )  # fmt: skip
    variants = Paraphrase(llm=RunnableLambda(lambda _: reply), max_calls=1).variants(QUESTION, 1)
    assert variants == ["Which team did Babe Ruth last homer for?"]
