"""The guard's sentence stream (``stream_mode="sentences"``): sentences to chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator, Iterator

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk

from esi_guard._pipeline import by_sentence
from esi_guard._pipeline.items import Item
from esi_guard._pipeline.steps import Pipeline
from esi_guard.guard import _tracing
from esi_guard.guard._messages import sentence_chunk
from esi_guard.result import Action
from esi_guard.sentences import SentenceScore

__all__ = ["asentences", "sentences"]


def _shown(
    pipeline: Pipeline, item: Item, action: Action, run_manager: CallbackManagerForLLMRun | None
) -> Generator[SentenceScore, None, None]:
    judged = by_sentence.stream(pipeline, item, _tracing.Traced(run_manager))
    return by_sentence.shown(judged, action)


def sentences(
    pipeline: Pipeline, item: Item, action: Action, run_manager: CallbackManagerForLLMRun | None
) -> Iterator[AIMessageChunk]:
    """The item's sentences shown as they are scored, as chunks; then it is decided."""
    for sentence in _shown(pipeline, item, action, run_manager):
        chunk = sentence_chunk(sentence)
        if run_manager is not None:
            run_manager.on_llm_new_token(sentence.text, chunk=ChatGenerationChunk(message=chunk))
        yield chunk


async def asentences(
    pipeline: Pipeline,
    item: Item,
    action: Action,
    run_manager: AsyncCallbackManagerForLLMRun | None,
) -> AsyncIterator[AIMessageChunk]:
    """Async :func:`sentences`: blocking steps in a worker thread, traced via ``get_sync``."""
    sync = run_manager.get_sync() if run_manager is not None else None
    shown = _shown(pipeline, item, action, sync)
    done = object()
    try:
        while (sentence := await asyncio.to_thread(next, shown, done)) is not done:
            assert isinstance(sentence, SentenceScore)
            chunk = sentence_chunk(sentence)
            if run_manager is not None:
                piece = ChatGenerationChunk(message=chunk)
                await run_manager.on_llm_new_token(sentence.text, chunk=piece)
            yield chunk
    finally:
        await asyncio.to_thread(shown.close)
