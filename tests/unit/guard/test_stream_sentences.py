"""stream_mode="sentences": each sentence shown once scored, never one past the threshold."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from functools import reduce
from operator import add
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk

from esi_guard import ESIGuard
from esi_guard.backends import AnswerPiece, ForcingRequest, ForcingSession, Generation, Messages
from esi_guard.backends.fake import FakeBackend
from esi_guard.exceptions import BackendError, ConfigurationError
from esi_guard.scoring import TopK

QUESTION = "Tell me three things."
ANSWER = "Paris is in France. Water boils at 100 degrees. The moon is made of cheese."


class Streaming(FakeBackend):
    """The fake, its answer streamed a token at a time; ``log`` records tokens and forcing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__({QUESTION: ANSWER}, default_sensitivity=1.0, **kwargs)
        self.log: list[tuple[str, int]] = []

    def stream_tokens(
        self, prompt: Messages, **kwargs: Any
    ) -> Generator[AnswerPiece | Generation | BackendError, None, None]:
        for item in super().stream_tokens(prompt, **kwargs):
            if not isinstance(item, AnswerPiece):
                yield item
                continue
            for i, token in enumerate(item.token_ids):
                self.log.append(("token", token))
                rows = TopK(item.topk.ids[i : i + 1], item.topk.values[i : i + 1])
                yield AnswerPiece((token,), rows)

    def open_forcing(
        self, request: ForcingRequest, *, top_k: int, max_answer_tokens: int
    ) -> ForcingSession:
        session = super().open_forcing(request, top_k=top_k, max_answer_tokens=max_answer_tokens)
        extend = session.extend

        def logged(ids: Sequence[int], text: str = "") -> Any:
            self.log.append(("extend", len(ids)))
            return extend(ids, text)

        session.extend = logged  # type: ignore[method-assign]
        return session


def scores() -> list[float]:
    result = ESIGuard(backend=Streaming(), threshold=4.5).assess([QUESTION])[0]
    return [sentence.score for sentence in result.sentences]


def streamed(guard: ESIGuard) -> tuple[list[AIMessageChunk], AIMessageChunk]:
    chunks = list(guard.stream(QUESTION))
    assert chunks[-1].chunk_position == "last"
    return chunks[:-1], chunks[-1]


def test_an_accepted_answer_streams_its_sentences_scored_as_the_whole_call_scores_them() -> None:
    backend = Streaming()
    threshold = max(scores()) + 0.01
    plain = ESIGuard(backend=backend, threshold=threshold).invoke(QUESTION)
    backend.log.clear()
    sentences, last = streamed(ESIGuard(backend=backend, threshold=threshold,
                                        stream_mode="sentences"))  # fmt: skip
    expected = plain.response_metadata["esi"]["sentences"]
    assert [c.content for c in sentences] == [s["text"] for s in expected]
    assert "".join(str(c.content) for c in sentences) + str(last.content) == plain.content
    for chunk, sentence in zip(sentences, expected, strict=True):
        (shown,) = chunk.response_metadata["esi"]["shown"]
        assert shown == sentence  # same score, signals, span and tokens, to the bit (fake)
    assert last.response_metadata["esi"] == plain.response_metadata["esi"]
    # Each sentence was forced once the next had begun, before the answer's end: its 4
    # tokens after the 6th (the newest token's text waits a token: a stop sequence or
    # the answer's end may yet drop it), then 5, then the last sentence's 6 at the end.
    assert [n for kind, n in backend.log if kind == "extend"] == [4, 5, 6]
    first_extend = backend.log.index(("extend", 4))
    assert [kind for kind, _ in backend.log[:first_extend]].count("token") == 6
    total = reduce(add, [*sentences, last])
    assert [s["text"] for s in total.response_metadata["esi"]["shown"]] == [
        s["text"] for s in expected
    ]
    assert total.response_metadata["esi"]["score"] == plain.response_metadata["esi"]["score"]


def test_redact_drops_a_sentence_past_the_threshold_and_streams_on() -> None:
    values = scores()
    worst = max(range(3), key=values.__getitem__)
    threshold = (max(values) + sorted(values)[1]) / 2
    guard = dict(backend=Streaming(), threshold=threshold, action="redact")
    plain = ESIGuard(**guard).invoke(QUESTION)  # type: ignore[arg-type]
    sentences, last = streamed(ESIGuard(**guard, stream_mode="sentences"))  # type: ignore[arg-type]
    kept = [
        s["text"] for s in plain.response_metadata["esi"]["sentences"] if s["decision"] == "accept"
    ]
    assert [c.content for c in sentences] == kept
    assert "".join(kept).rstrip() == plain.content and last.content == ""
    (removed,) = last.response_metadata["esi"]["redacted"]
    assert all(removed["text"] not in c.content for c in sentences)
    assert last.response_metadata["esi"]["sentences"][worst]["decision"] == "redact"


@pytest.mark.parametrize(("action", "tail"), [("flag", ""), ("abstain", "No.")])
def test_other_actions_withhold_the_sentence_past_the_threshold_and_all_after_it(
    action: str, tail: str
) -> None:
    values = scores()
    first_bad = next(i for i, v in enumerate(values) if v > min(values))
    threshold = min(values) + (values[first_bad] - min(values)) / 2
    guard = ESIGuard(backend=Streaming(), threshold=threshold, action=action, decide_on="sentences",
                     abstain_message="No.", stream_mode="sentences")  # type: ignore[arg-type]  # fmt: skip
    sentences, last = streamed(guard)
    shown = [s for s in last.response_metadata["esi"]["sentences"][:first_bad]]
    assert [c.content for c in sentences] == [s["text"] for s in shown]
    assert last.content == tail
    assert last.response_metadata["esi"]["decision"] == action


def test_a_sentence_that_could_not_be_scored_is_never_shown() -> None:
    backend = Streaming(failures={QUESTION: "teacher_force"})
    guard = ESIGuard(backend=backend, threshold=4.5, on_error="flag", stream_mode="sentences")
    sentences, last = streamed(guard)
    assert sentences == [] and last.content == ""
    esi = last.response_metadata["esi"]
    assert esi["decision"] == "flag" and not esi["scored"]


def test_invoke_in_sentence_mode_is_the_non_streamed_call() -> None:
    plain = ESIGuard(backend=Streaming(), threshold=4.5).invoke(QUESTION)
    backend = Streaming()
    message = ESIGuard(backend=backend, threshold=4.5, stream_mode="sentences").invoke(QUESTION)
    assert message.content == plain.content
    assert message.response_metadata["esi"] == plain.response_metadata["esi"]
    assert not [kind for kind, _ in backend.log if kind == "extend"]


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"support": "all"}, "support='all'"),
    ],
)
def test_settings_that_cannot_stream_sentences_are_refused(
    settings: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"stream_mode='sentences'.*{named}"):
        ESIGuard(backend=Streaming(), threshold=0.5, stream_mode="sentences", **settings)


async def test_astream_shows_the_same_sentences_as_stream() -> None:
    values = scores()
    threshold = (max(values) + sorted(values)[1]) / 2
    guard = ESIGuard(backend=Streaming(), threshold=threshold, action="redact",
                     stream_mode="sentences")  # fmt: skip
    chunks = list(guard.stream(QUESTION))
    achunks = [chunk async for chunk in guard.astream(QUESTION)]
    assert [c.content for c in achunks] == [c.content for c in chunks]
    assert [c.response_metadata for c in achunks] == [c.response_metadata for c in chunks]
    assert len(achunks) == 3  # two sentences shown, one dropped, the last chunk


async def test_astream_events_report_each_sentence_and_the_steps() -> None:
    guard = ESIGuard(backend=Streaming(), threshold=4.5, stream_mode="sentences")
    events = [event async for event in guard.astream_events(QUESTION, version="v2")]
    kinds = [(event["event"], event["name"]) for event in events]
    tokens = [event for event in events if event["event"] == "on_chat_model_stream"]
    assert [event["data"]["chunk"].content for event in tokens][:3] == [
        "Paris is in France. ", "Water boils at 100 degrees. ", "The moon is made of cheese."
    ]  # fmt: skip
    steps = {name for kind, name in kinds if kind == "on_chain_start"}
    assert {"esi_intervene", "esi_generate", "esi_score"} <= steps


def test_a_failed_intervention_gives_the_stream_the_result_the_whole_call_gives() -> None:
    from esi_guard import SkipOneChar

    class Down(SkipOneChar):
        def batch_variants(self, questions, n, *, seed=0):  # type: ignore[no-untyped-def]
            raise RuntimeError("paraphraser down")

    settings: dict[str, Any] = {"backend": Streaming(), "threshold": 4.5, "intervention": Down(),
                                "on_error": "flag"}  # fmt: skip
    plain = ESIGuard(**settings).invoke(QUESTION).response_metadata["esi"]
    sentences, last = streamed(ESIGuard(**settings, stream_mode="sentences"))
    assert sentences == [] and not plain["scored"]
    assert plain["reason"].startswith("intervention_error: intervention failed: RuntimeError")
    assert plain["answer"] == ANSWER  # the answer was generated and is reported
    assert last.response_metadata["esi"] == plain


def test_a_failed_generation_gives_the_stream_the_result_the_whole_call_gives() -> None:
    # The variants were asked for first; the whole call, which never got that far, has none.
    settings: dict[str, Any] = {"backend": Streaming(failures={QUESTION: "generate"}),
                                "threshold": 4.5, "on_error": "flag"}  # fmt: skip
    plain = ESIGuard(**settings).invoke(QUESTION).response_metadata["esi"]
    sentences, last = streamed(ESIGuard(**settings, stream_mode="sentences"))
    assert sentences == [] and not plain["scored"]
    assert plain["reason"].startswith("backend_error: scripted generate failure")
    assert plain["variants_used"] == 0
    assert last.response_metadata["esi"] == plain
