"""The whole esi_guard error tree.

Every error the library raises on purpose is an ``ESIGuardError``::

    ESIGuardError
    ├── ConfigurationError   bad parameters, missing extras' settings, no chat template
    ├── InputError           an input the guard cannot score (type, empty question)
    ├── ScoringError         distributions that cannot be scored (shapes, NaN/inf, no tokens)
    └── BackendError         the engine failed (model loading, forward pass, server)
        ├── ModelLoadError   the model or tokenizer could not be loaded
        └── APIError         an OpenAI-compatible server failed or answered badly
                             (``retryable``, ``status_code``, ``original``)

``ConfigurationError`` and ``InputError`` are also ``ValueError`` so that code written
against plain Python conventions keeps working.

A high ESI score is a *result*, never an exception: the guard reports it in the
answer's metadata and acts on it (flag, abstain, route).
"""

from __future__ import annotations

__all__ = [
    "APIError",
    "BackendError",
    "ConfigurationError",
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
    """Distributions handed to the ESI estimator cannot be scored."""


class BackendError(ESIGuardError):
    """The model engine failed while generating or teacher forcing."""


class ModelLoadError(BackendError):
    """A model or its tokenizer could not be loaded."""


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
