"""The whole esi_guard error tree.

Every error the library raises on purpose is an ``ESIGuardError``::

    ESIGuardError
    ├── ConfigurationError   bad parameters, missing extras' settings, no chat template
    ├── InputError           an input the guard cannot score (type, empty question)
    ├── ScoringError         distributions that cannot be scored (shapes, NaN/inf, no tokens)
    └── BackendError         the engine failed (model loading, forward pass, server)
        ├── ModelLoadError   the model or tokenizer could not be loaded
        ├── ContextLengthError  the prompt (and answer) do not fit the model's context
        └── APIError         an OpenAI-compatible server failed or answered badly
                             (``retryable``, ``status_code``, ``original``)

``ConfigurationError`` and ``InputError`` are also ``ValueError`` so that code written
against plain Python conventions keeps working.

A high ESI score is a *result*, never an exception: the guard reports it in the
answer's metadata and acts on it (flag, abstain, route). An answer that cannot be
scored follows the guard's ``on_error`` policy: withheld (``abstain``, the default) or
flagged with the reason in its metadata, or, with ``on_error="raise"``, one of these
errors (``ScoringError`` carries the unscored result in ``.result``).
"""

from __future__ import annotations

__all__ = [
    "APIError",
    "BackendError",
    "ConfigurationError",
    "ContextLengthError",
    "ESIGuardError",
    "InputError",
    "ModelLoadError",
    "ScoringError",
]


class ESIGuardError(Exception):
    """Base class of every error raised by esi_guard."""


class ConfigurationError(ESIGuardError, ValueError):
    """A parameter, option or model set-up is invalid."""


class InputError(ESIGuardError, ValueError):
    """An input cannot be guarded: unsupported type, no question, empty question."""


class ScoringError(ESIGuardError):
    """Distributions handed to the ESI estimator cannot be scored.

    Raised by the guard with ``on_error="raise"`` for an answer it could not score;
    ``result`` then holds that answer's unscored ``ESIResult`` (answer, reason), so
    nothing is lost.
    """

    def __init__(self, message: str, *, result: object | None = None) -> None:
        super().__init__(message)
        self.result = result
        """The unscored ``ESIResult``, when the guard raised this; else None."""


class BackendError(ESIGuardError):
    """The model engine failed while generating or teacher forcing."""


class ModelLoadError(BackendError):
    """A model or its tokenizer could not be loaded."""


class ContextLengthError(BackendError):
    """A prompt, or a prompt plus its answer, is longer than the model's context window.

    The backend refuses it (nothing is truncated, since a cut prompt is another
    question); the other prompts of a batch go on. ``HFBackend`` checks the model's
    window itself; an API backend raises one (that is also an :class:`APIError`) when
    the server answers HTTP 400 about its context length.
    """


class APIError(BackendError):
    """An OpenAI-compatible server failed, or its answer cannot be used.

    Raised after retries are spent (for retryable failures) or at once (for the rest).
    The message never holds the API key.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        status_code: int | None = None,
        original: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        """Whether the failure was of a kind that is retried (429, 5xx, timeout, connection)."""
        self.status_code = status_code
        """The HTTP status, when the server answered with one."""
        self.original = original
        """The exception from the openai SDK (or the parser) that caused this one."""
