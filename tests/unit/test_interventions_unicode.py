"""Character edits on any script: a letter's combining marks are part of it, numbers are not."""

from __future__ import annotations

import unicodedata
from typing import Any

from esi_guard import ESIGuard, ESIResult, FakeBackend, SkipOneChar, Typo
from esi_guard.backends import ForcingRequest


def test_soc_on_decomposed_text_never_moves_an_accent_onto_another_letter() -> None:
    # NFD "café" is c a f e U+0301: its one eligible position (M*=3) is "é", whole.
    nfd = unicodedata.normalize("NFD", "Who ate a café?")
    assert SkipOneChar(p=1.0).variants(nfd, 5) == ["Who ate a caf?"]  # was "caf\u0301"
    question = unicodedata.normalize("NFD", "Qui a écrit « Les Misérables » en exil ?")
    allowed = set(unicodedata.normalize("NFC", question))
    for intervention in (SkipOneChar(p=1.0), SkipOneChar(p=0.5, words="exact")):
        for variant in intervention.variants(question, 10):
            # A deletion brings no new character: "Miśrables" held an "ś".
            assert set(unicodedata.normalize("NFC", variant)) <= allowed, variant


def test_typo_replaces_a_letter_with_its_marks() -> None:
    nfd = unicodedata.normalize("NFD", "Who ate a café?")
    for variant in Typo(p=1.0).variants(nfd, 5):
        assert variant.startswith("Who ate a caf") and variant.endswith("?")
        assert len(variant) == len("Who ate a café?")  # one letter for "e" + U+0301
        assert not any(unicodedata.combining(char) for char in variant)


def test_soc_finds_the_words_of_an_abugida() -> None:
    # Devanagari vowel signs are marks (Mc): "राजधानी" is र+ा ज ध+ा न+ी, four characters.
    question = "भारत की राजधानी क्या है?"
    assert SkipOneChar(p=1.0).variants(question, 5) == ["भारत की राजधा क्या है?"]  # was []


def test_soc_never_deletes_a_superscript_digit() -> None:
    # "Digits ... are never changed, so numbers keep their meaning": "²" is a digit (No).
    # Area, room: one deletion place each (index 3); metres: three (3, 4, 5).
    assert sorted(SkipOneChar(p=1.0).variants("Area of the room in metres²?", 10)) == [
        "Are of the roo in metes²?",
        "Are of the roo in metre²?",
        "Are of the roo in metrs²?",
    ]  # was also "Are of the roo in metres?" (m² read as m)


class Recording(FakeBackend):
    """A fake backend that keeps every forcing request it gets."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(default_answer="Delhi", default_sensitivity=1.0, **kwargs)
        self.requests: list[ForcingRequest] = []

    def teacher_force(self, requests: Any, *, top_k: int) -> Any:
        self.requests += list(requests)
        return super().teacher_force(requests, top_k=top_k)


def test_a_hindi_question_is_scored_on_the_variant_rows_sent() -> None:
    backend = Recording()
    guard = ESIGuard(backend=backend, threshold=0.5, intervention=SkipOneChar(p=1.0))
    (result,) = guard.assess(["भारत की राजधानी क्या है?"])
    assert isinstance(result, ESIResult) and result.scored, result  # was no_effective_variant
    (request,) = backend.requests
    assert [rows[-1]["content"] for rows in request.variants] == ["भारत की राजधा क्या है?"]


def test_decomposed_accents_stay_on_their_letters_in_the_rows_sent() -> None:
    backend = Recording()
    guard = ESIGuard(backend=backend, threshold=0.5, intervention=SkipOneChar(p=1.0))
    guard.assess([unicodedata.normalize("NFD", "Who ate a café?")])
    (request,) = backend.requests
    assert [rows[-1]["content"] for rows in request.variants] == ["Who ate a caf?"]
