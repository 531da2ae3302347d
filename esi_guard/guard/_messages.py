"""The guard's answer as LangChain messages: content by decision, metadata, usage, chunks."""

from __future__ import annotations

from typing import Any, cast

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from esi_guard._pipeline.items import Item
from esi_guard.applied import apply
from esi_guard.exceptions import BackendError
from esi_guard.guard._assess import raised
from esi_guard.result import ESIResult, OnError
from esi_guard.sentences import SentenceScore

__all__ = [
    "chat_result",
    "decision",
    "last_chunk",
    "last_message_chunk",
    "piece_chunk",
    "sentence_chunk",
    "sentences_last",
    "sentences_last_chunk",
]


def decision(item: Item) -> str | None:
    """The decision on a decided item (None when its outcome is an error to raise)."""
    return item.outcome.decision if isinstance(item.outcome, ESIResult) else None


def chat_result(
    item: Item, fallback: Any, on_error: OnError, abstain_message: str, model_name: str
) -> ChatResult:
    """The chat result for a decided item, or the error ``on_error="raise"`` raises.

    Content, usage and metadata are :func:`~esi_guard.applied.apply`'s; usage counts the answer's
    tokens (and a fallback's), ESI's extra work is in ``response_metadata["esi"]``.
    """
    result = item.outcome
    if isinstance(result, BackendError):
        raise result
    assert result is not None  # the pipeline decides every item
    if not result.scored and on_error == "raise":
        raise raised(result)
    applied = apply(result, fallback, abstain_message=abstain_message)
    usage = UsageMetadata(
        input_tokens=applied.input_tokens,
        output_tokens=applied.output_tokens,
        total_tokens=applied.total_tokens,
    )
    routed = cast(UsageMetadata, getattr(fallback, "usage_metadata", None) or {})
    if "fallback_used" in applied.esi and "input_token_details" in routed:
        usage["input_token_details"] = routed["input_token_details"]
    if "fallback_used" in applied.esi and "output_token_details" in routed:
        usage["output_token_details"] = routed["output_token_details"]
    meta = {"model_name": model_name, **applied.fallback_metadata,
            "finish_reason": applied.finish_reason, "esi": applied.esi}  # fmt: skip
    message = AIMessage(content=applied.content, response_metadata=meta, usage_metadata=usage)
    return ChatResult(generations=[ChatGeneration(message=message)])


def last_message_chunk(message: BaseMessage, sent: str = "") -> AIMessageChunk:
    """The last chunk of a stream: the message's text not yet ``sent``, metadata, usage."""
    content = message.content
    if sent and isinstance(content, str) and content.startswith(sent):
        content = content[len(sent) :]
    return AIMessageChunk(
        content=content,
        id=message.id,
        response_metadata=message.response_metadata,
        usage_metadata=getattr(message, "usage_metadata", None),
        chunk_position="last",
    )


def last_chunk(result: ChatResult, sent: str = "") -> ChatGenerationChunk:
    """:func:`last_message_chunk` of a chat result, as a generation chunk."""
    return ChatGenerationChunk(message=last_message_chunk(result.generations[0].message, sent))


def piece_chunk(text: str) -> ChatGenerationChunk:
    """A chunk of a live stream: answer text as it is generated, before any score."""
    return ChatGenerationChunk(message=AIMessageChunk(content=text))


def sentence_chunk(sentence: SentenceScore) -> AIMessageChunk:
    """A scored sentence as a stream's chunk: its text, its score in the metadata.

    ``["esi"]["shown"]`` is a one-item list: langchain-core concatenates lists when adding chunks
    (a float twice is an error), so the stream's sum lists every sentence shown.
    """
    return AIMessageChunk(content=sentence.text,
                          response_metadata={"esi": {"shown": [sentence.as_dict()]}})  # fmt: skip


def sentences_last_chunk(message: AIMessage, sent: str = "") -> AIMessageChunk:
    """The last chunk of a sentence stream: the answer's metadata, only text that replaced it."""
    chunk = last_message_chunk(message)
    decision = message.response_metadata.get("esi", {}).get("decision")
    if decision not in ("abstain", "route"):
        chunk.content = ""
    return chunk


def sentences_last(result: ChatResult) -> ChatGenerationChunk:
    """:func:`sentences_last_chunk` of a chat result, as a generation chunk."""
    message = result.generations[0].message
    return ChatGenerationChunk(message=sentences_last_chunk(cast(AIMessage, message)))
