"""The helpers the engines share: stop sequences cut an answer at a token boundary."""

from __future__ import annotations

import pytest

from esi_guard.backends._engine_helpers import StreamedText, stopped_length

PIECES = {1: "Mich", 2: "el", 3: "angelo", 4: " y", 5: "ou", 6: " know"}


def decode(ids: object) -> str:
    return "".join(PIECES[i] for i in ids)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("stop", "kept"),
    [
        ([], None),  # nothing to stop at
        (["never"], None),
        (["angelo"], 2),  # a stop that starts on a token boundary
        (["you"], 3),  # " y" holds the stop's first letter and goes with it
        (["ou", "el"], 1),  # the earliest stop wins
        ([""], None),  # an empty stop sequence is no stop sequence
    ],
)
def test_stopped_length(stop: list[str], kept: int | None) -> None:
    assert stopped_length([1, 2, 3, 4, 5, 6], decode, stop) == kept


WORDS = {1: "The", 2: " capital", 3: " is", 4: " Par", 5: "is", 6: ".", 7: " "}


def words(ids: object) -> str:
    return "".join(WORDS[i] for i in ids)  # type: ignore[attr-defined]


def stream(ids: list[int], stop: list[str], *, strip: bool = True) -> tuple[list[str], str]:
    text = StreamedText(words, stop, strip=strip)
    return [piece for i in ids if (piece := text.add([i]))], text.sent


def test_streamed_text_never_runs_ahead_of_the_answer() -> None:
    pieces, _ = stream([1, 2, 3, 4, 5, 6], [])
    assert pieces == ["The", " capital", " is", " Par", "is"]  # the newest token waits
    assert StreamedText(words, []).rest("The capital is Paris.") == "The capital is Paris."
    text = StreamedText(words, [])
    for i in [1, 2, 3, 4, 5, 6]:
        text.add([i])
    assert text.sent + text.rest("The capital is Paris.") == "The capital is Paris."


def test_streamed_text_holds_back_what_a_stop_sequence_may_take() -> None:
    _, sent = stream([1, 2, 3, 4, 5, 6], ["Paris"])
    assert sent == "The capital is"  # " Par" could begin the stop sequence: never sent
    _, sent = stream([1, 7, 2], [])
    assert sent == "The"  # trailing whitespace waits: the answer is stripped
    _, sent = stream([1, 7, 2], [], strip=False)
    assert sent == "The "


def test_the_template_prefix_is_what_the_bare_prompt_shares_short_of_the_last_token() -> None:
    """The backend's template prefix: the rendered prompt against the same prompt with its
    last message's text left out (``LlamaCppBackend._prefix``)."""
    from esi_guard.backends._engine_helpers import MIN_SHARED_PREFIX, shared_prefix

    head = list(range(10))  # system prompt and the user's header
    assert shared_prefix([[*head, 50, 51, 99], [*head, 77, 99]]) == 10
    assert shared_prefix([[*head, 99], [*head, 99]]) == 10  # the last token stays the row's
    assert shared_prefix([[*head[:3], 50, 99], [*head[:3], 77]]) == 0  # under the minimum
    assert MIN_SHARED_PREFIX > 3
    assert shared_prefix([[*head, 50, 99], [*head, 77, 99]], reuse=False) == 0
