"""Decisions per sentence: every answer's sentences, action="redact", decide_on="sentences"."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from esi_guard import ESIGuard
from esi_guard.backends.fake import FakeBackend
from esi_guard.exceptions import ConfigurationError

QUESTION = "Tell me three things."
ANSWER = "Paris is in France. Water boils at 100 degrees. The moon is made of cheese."


def _backend() -> FakeBackend:
    return FakeBackend({QUESTION: ANSWER}, default_sensitivity=1.0)


def _scores() -> list[float]:
    result = ESIGuard(backend=_backend(), threshold=4.5).assess([QUESTION])[0]
    return [sentence.score for sentence in result.sentences]


def test_every_scored_answer_carries_its_sentences_in_the_metadata() -> None:
    message = ESIGuard(backend=_backend(), threshold=4.5).invoke(QUESTION)
    esi = message.response_metadata["esi"]
    sentences = esi["sentences"]
    assert [s["text"] for s in sentences] == [
        "Paris is in France. ", "Water boils at 100 degrees. ", "The moon is made of cheese."
    ]  # fmt: skip
    assert "".join(s["text"] for s in sentences) == ANSWER == message.content
    assert {"text", "start", "end", "score", "decision"} <= sentences[0].keys()
    assert all(s["decision"] == "accept" for s in sentences)
    # The whole answer's score is the mean over its tokens: the sentences' weighted mean.
    tokens = [s["end_token"] - s["first_token"] for s in sentences]
    weighted = sum(n * s["score"] for n, s in zip(tokens, sentences, strict=True))
    assert esi["score"] == pytest.approx(weighted / sum(tokens))
    assert sum(tokens) == len(esi["answer_token_ids"])


def test_redact_removes_the_sentences_past_the_threshold_and_lists_them() -> None:
    scores = _scores()
    worst = max(range(3), key=scores.__getitem__)
    threshold = (max(scores) + sorted(scores)[1]) / 2  # only the worst is past it
    message = ESIGuard(backend=_backend(), threshold=threshold, action="redact").invoke(QUESTION)
    esi = message.response_metadata["esi"]
    assert esi["decision"] == "redact"
    (removed,) = esi["redacted"]
    assert removed["score"] == pytest.approx(scores[worst]) and removed["threshold"] == threshold
    kept = ANSWER[: removed["start"]] + ANSWER[removed["end"] :]
    assert message.content == kept.rstrip()
    assert removed["text"] not in message.content
    assert [s["decision"] for s in esi["sentences"]] == [
        "redact" if n == worst else "accept" for n in range(3)
    ]
    assert esi["answer"] == ANSWER  # the whole answer stays in the metadata


def test_redact_keeps_a_trusted_answer_whole_and_abstains_when_nothing_is_left() -> None:
    scores = _scores()
    kept = ESIGuard(backend=_backend(), threshold=max(scores) + 0.01, action="redact")
    message = kept.invoke(QUESTION)
    assert message.content == ANSWER
    assert message.response_metadata["esi"]["decision"] == "accept"
    assert "redacted" not in message.response_metadata["esi"]
    nothing = ESIGuard(backend=_backend(), threshold=min(scores) - 0.01, action="redact",
                       abstain_message="No.")  # fmt: skip
    message = nothing.invoke(QUESTION)
    assert message.content == "No."
    assert message.response_metadata["esi"]["decision"] == "abstain"
    assert len(message.response_metadata["esi"]["redacted"]) == 3


def test_decide_on_sentences_acts_on_one_sentence_past_the_threshold() -> None:
    scores = _scores()
    whole = ESIGuard(backend=_backend(), threshold=4.5).assess([QUESTION])[0].score
    assert whole is not None
    threshold = (whole + max(scores)) / 2  # the whole answer passes, one sentence does not
    assert whole < threshold < max(scores)
    on_answer = ESIGuard(backend=_backend(), threshold=threshold, action="abstain")
    assert on_answer.assess([QUESTION])[0].decision == "accept"
    on_sentences = ESIGuard(backend=_backend(), threshold=threshold, action="abstain",
                            decide_on="sentences")  # fmt: skip
    result = on_sentences.assess([QUESTION])[0]
    assert result.decision == "abstain"
    assert [s.decision for s in result.sentences].count("abstain") == 1


def test_sentence_threshold_decides_sentences_apart_from_the_answer_threshold() -> None:
    scores = _scores()
    guard = ESIGuard(backend=_backend(), threshold=0.01, action="redact",
                     sentence_threshold=max(scores) + 0.01)  # fmt: skip
    result = guard.assess([QUESTION])[0]
    assert result.decision == "accept"
    assert result.as_dict()["sentence_threshold"] == max(scores) + 0.01


class _NoText(FakeBackend):
    def decode(self, ids: Sequence[int]) -> None:  # type: ignore[override]
        return None


def test_an_answer_that_cannot_be_split_is_never_passed_by_a_guard_on_sentences() -> None:
    backend = _NoText({QUESTION: ANSWER}, default_sensitivity=1.0)
    result = ESIGuard(backend=backend, threshold=4.5, action="redact").assess([QUESTION])[0]
    assert not result.scored
    assert result.decision == "abstain"
    assert result.reason is not None and result.reason.startswith("no_sentences")
    assert result.work == {"forced_variants": 0, "forced_tokens": 0}  # known before forcing
    # A guard on the whole answer still decides it, without sentences.
    plain = ESIGuard(backend=backend, threshold=4.5).assess([QUESTION])[0]
    assert plain.scored and plain.decision == "accept" and plain.sentences == []


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"sentence_threshold": -1.0}, "sentence_threshold=-1.0"),
    ],
)
def test_settings_that_cannot_decide_on_sentences_are_refused(
    settings: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        ESIGuard(backend=_backend(), threshold=0.5, **settings)
