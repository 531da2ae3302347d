"""Streaming one answer out of transformers' ``generate`` while it runs in a worker thread.

Closing the stream ends generation early; the top-k still comes from ``generate``'s output.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from esi_guard.backends._engine_helpers import StreamedText
from esi_guard.backends._types import Generation, Messages
from esi_guard.backends.hidden import HiddenSpec

if TYPE_CHECKING:
    from esi_guard.backends.hf._engine import Engine
    from esi_guard.exceptions import BackendError

__all__ = ["stream_answer", "stream_tokens"]


class _QueueStreamer:
    """transformers' streamer interface: the prompt first (skipped), then each new token."""

    def __init__(self, tokens: queue.Queue[list[int] | None]) -> None:
        self._tokens = tokens
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self._tokens.put([int(t) for t in value.reshape(-1).tolist()])

    def end(self) -> None:
        self._tokens.put(None)


def _halt_criterion(halt: threading.Event) -> Any:
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Halt(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return torch.full((input_ids.shape[0],), halt.is_set(), device=input_ids.device)

    return StoppingCriteriaList([Halt()])


def stream_tokens(run: Callable[[Any, Any], Any]) -> Iterator[list[int] | tuple[str, Any]]:
    """New token ids as ``run(streamer, stopping_criterion)`` makes them, then its outcome.

    The outcome is ``("result", value)`` or ``("error", exception)``; closing early stops it.
    """
    tokens: queue.Queue[list[int] | None] = queue.Queue()
    halt = threading.Event()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["result"] = run(_QueueStreamer(tokens), _halt_criterion(halt))
        except Exception as exc:  # handed to the consumer, which decides
            outcome["error"] = exc
        finally:
            tokens.put(None)

    thread = threading.Thread(target=work, name="esi-guard-stream", daemon=True)
    thread.start()
    try:
        while (ids := tokens.get()) is not None:
            yield ids
    finally:
        halt.set()
        thread.join()
    yield ("error", outcome["error"]) if "error" in outcome else ("result", outcome["result"])


def stream_answer(
    engine: Engine,
    prompt: Messages,
    max_new_tokens: int,
    top_k: int,
    stop: Sequence[str],
    hidden: HiddenSpec | None = None,
) -> Generator[str | Generation | BackendError, None, None]:
    """:meth:`HFBackend.stream_generate`'s work, under the engine's lock."""
    with engine.lock:
        row = engine.render(prompt)
        too_long = engine.too_long(len(row) + 1, "the prompt (plus one answer token)")
        if too_long is not None:
            yield too_long
            return
        room = max_new_tokens
        if engine.context_length is not None:
            room = min(room, engine.context_length - len(row))
        text = StreamedText(engine.decode, stop)
        for piece in stream_tokens(
            lambda streamer, halt: engine.generate_chunk(
                [row], room, top_k, stop, streamer, halt, hidden=hidden
            )
        ):
            if isinstance(piece, list):
                if delta := text.add(piece):
                    yield delta
            elif piece[0] == "error":
                raise piece[1]
            else:
                gen = piece[1][0]
                if isinstance(gen, Generation) and (rest := text.rest(gen.text)):
                    yield rest
                yield gen
