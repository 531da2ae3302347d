"""Settling how to talk to the server (echo or chat mode, the echo layout) once, by probing."""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

from esi_guard.backends._template import ChatTemplate
from esi_guard.backends.openai._transport import _Transport
from esi_guard.backends.openai._wire import (
    _PROBE_MESSAGES,
    _PROBE_PREFIX,
    _argmax,
    _Call,
    _completion_args,
    _completion_tokens,
    _echo_args,
    _echo_entries,
    _first_choice,
    _locate,
    _tail_text,
)
from esi_guard.exceptions import APIError, ConfigurationError

Mode = Literal["echo", "chat", "auto"]
Alignment = Literal["auto", "same", "next"]


class _Negotiator:
    """The backend's mode and echo alignment, settled on first use (thread-safe)."""

    def __init__(
        self,
        transport: _Transport,
        template: ChatTemplate | None,
        mode: Mode,
        alignment: Alignment,
    ) -> None:
        self.transport = transport
        self.template = template
        self.mode: Mode = mode
        self.alignment: Alignment = alignment
        self._lock = threading.Lock()

    def resolve(self) -> Literal["echo", "chat"]:
        """Settle ``auto`` mode and alignment, probing the server once.

        A client error or no logprobs means chat; a retryable error is raised and settles nothing.
        """
        if self.mode == "chat" or (self.mode == "echo" and self.alignment != "auto"):
            return self.mode
        with self._lock:
            if self.mode == "auto" and self.template is None:
                self.mode = "chat"
            if self.mode == "chat" or (self.mode == "echo" and self.alignment != "auto"):
                return self.mode
            try:
                detected = self.probe_alignment()
            except APIError as exc:
                if self.mode == "echo" or exc.retryable:
                    raise
                self.mode = "chat"
                return self.mode
            if self.alignment == "auto":
                self.alignment = detected
            self.mode = "echo"
            return self.mode

    async def aresolve(self) -> None:
        """:meth:`resolve` from async code (in a thread, only while something is unsettled)."""
        if self.mode == "auto" or (self.mode == "echo" and self.alignment == "auto"):
            await asyncio.to_thread(self.resolve)

    def probe_alignment(self) -> Alignment:
        """Continue a counting prompt greedily, echo it, and see which layout fits."""
        assert self.template is not None
        prompt = self.template.render(_PROBE_MESSAGES) + _PROBE_PREFIX  # type: ignore[arg-type]
        gen = self.transport.send(_Call("completions", _completion_args(prompt, 12, 1)))
        answer = _first_choice(gen, chat=False)
        tokens = _completion_tokens(answer)
        text = "".join(tokens)
        if len(tokens) < 3:
            msg = "the alignment probe's continuation is too short to tell the layout"
            raise APIError(msg)
        probe = self.transport.send(_Call("completions", _echo_args(prompt + text, 1)))
        echoed = _first_choice(probe, chat=False)
        entries = _echo_entries(echoed)
        start, end = _locate(entries.tokens, _tail_text(echoed, prompt + text), pieces=tokens)
        votes = {"same": 0, "next": 0}
        for i in range(start, end):
            token = entries.tokens[i]
            votes["same"] += _argmax(entries.top[i]) == token
            votes["next"] += i > 0 and _argmax(entries.top[i - 1]) == token
        best: Alignment = "same" if votes["same"] >= votes["next"] else "next"
        if votes[best] < 0.75 * len(tokens) or votes["same"] == votes["next"]:
            msg = (
                f"cannot tell the server's echo logprob layout (greedy tokens that are their "
                f"entry's top-1: same={votes['same']}, next={votes['next']} of {len(tokens)}); "
                "pass echo_alignment='same' or 'next'"
            )
            raise ConfigurationError(msg)
        return best
