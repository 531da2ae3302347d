"""The whole esi_guard error tree.

Every error the library raises on purpose is an ``ESIGuardError``, recognised by its type, never
its message. The right-hand column is each class's ``code`` (inherited where blank); an unscored
answer's ``reason`` is ``"<code>: <message>"`` of the error that stopped it (:func:`reason`)::

    ESIGuardError                                                               error
    ├── ConfigurationError            bad parameters or settings
    ├── InputError                    an input it cannot guard (empty question)
    ├── ScoringError                  an answer that cannot be scored           scoring_error
    │                                 (finer codes: empty_answer, no_effective_variant)
    ├── UncertainAnswerError          action="raise": an answer past threshold  uncertain_answer
    └── BackendError                  the engine failed (forward pass, server)  backend_error
        ├── ModelLoadError            the model or tokenizer did not load
        ├── ContextLengthError        the prompt (and answer) do not fit        context_overflow
        │   └── APIContextLengthError also an APIError: a server's HTTP 400
        ├── OutOfMemoryError          one prompt alone does not fit in memory   out_of_memory
        ├── InterventionError         the intervention failed (paraphraser)     intervention_error
        └── APIError                  an OpenAI-compatible server failed

``ConfigurationError`` and ``InputError`` are also ``ValueError``. A high ESI score is a *result*,
not an exception (reported and acted on), except with the agent middleware's ``action="raise"``,
so that a middleware listed before it (LangChain's ``ModelFallbackMiddleware``) can take over. An
unscorable answer follows ``on_error``: withheld (``abstain``, the default), flagged with the
reason, or raised as one of these errors (``ScoringError.result`` holds the unscored result).

Warnings (``UserWarning``) for what is not an error but rarely what the user meant:

* ``WholeMessageWarning``, once per guard: the question text is long (over 512 characters), so
  the whole human message is intervened on (``ESIGuard.with_prompt`` takes the question alone);
  ``esi-guard serve`` returns it to each caller in ``esi.warnings``.
* ``EngineMismatchWarning``, from ``ESIGuard.from_calibration``: the threshold file was calibrated
  on another engine for the same model; the scores are close, not identical.
* ``PromptMismatchWarning``, once per guard: a prompt under another system prompt or template than
  the threshold file's; the threshold then holds only approximately.
"""

from __future__ import annotations

__all__ = [
    "APIContextLengthError",
    "APIError",
    "BackendError",
    "ConfigurationError",
    "ContextLengthError",
    "ESIGuardError",
    "EngineMismatchWarning",
    "InputError",
    "InterventionError",
    "ModelLoadError",
    "OutOfMemoryError",
    "PromptMismatchWarning",
    "ScoringError",
    "UncertainAnswerError",
    "WholeMessageWarning",
    "reason",
]


class WholeMessageWarning(UserWarning):
    """A long human message is being intervened on as a whole (see the module)."""


class EngineMismatchWarning(UserWarning):
    """A threshold file calibrated on another engine than the guard's (see the module)."""


class PromptMismatchWarning(UserWarning):
    """A prompt unlike the one the guard's threshold file was calibrated under (see the module)."""


class ESIGuardError(Exception):
    """Base class of every error raised by esi_guard."""

    code: str = "error"
    """The reason code an unscored result reports for this error."""


class ConfigurationError(ESIGuardError, ValueError):
    """A parameter, option or model set-up is invalid."""


class InputError(ESIGuardError, ValueError):
    """An input cannot be guarded: unsupported type, no question, empty question."""


class ScoringError(ESIGuardError):
    """Distributions handed to the ESI estimator cannot be scored (see ``result``)."""

    code = "scoring_error"

    def __init__(
        self, message: str, *, result: object | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.result = result
        """The unscored ``ESIResult`` (answer, reason) when the guard raised this; else None."""
        if code is not None:
            self.code = code  # empty_answer, no_effective_variant: finer than the class


class UncertainAnswerError(ESIGuardError):
    """An agent's answer past the threshold, raised by ``ESIMiddleware(action="raise")``."""

    code = "uncertain_answer"

    def __init__(self, message: str, *, result: object, answer: object = None) -> None:
        super().__init__(message)
        self.result = result
        """The answer's scored ``ESIResult`` (``decision == "raise"``)."""
        self.answer = answer
        """The withheld ``AIMessage``, so nothing is lost."""


class BackendError(ESIGuardError):
    """The model engine failed while generating or teacher forcing."""

    code = "backend_error"


class ModelLoadError(BackendError):
    """A model or its tokenizer could not be loaded."""


class ContextLengthError(BackendError):
    """A prompt (plus its answer) exceeds the context window; nothing is cut, others go on."""

    code = "context_overflow"


class OutOfMemoryError(BackendError):
    """The device ran out of memory for one prompt alone (``HFBackend`` splits a batch first)."""

    code = "out_of_memory"


class InterventionError(BackendError):
    """The intervention failed to make the variants: any exception it raised, per batch."""

    code = "intervention_error"


class APIError(BackendError):
    """An OpenAI-compatible server failed or answered unusably (after retries, where retryable).

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


class APIContextLengthError(APIError, ContextLengthError):
    """A server's refusal (HTTP 400) of a prompt longer than its context: both errors at once."""

    code = "context_overflow"


def reason(error: ESIGuardError) -> str:
    """The ``reason`` an unscored result reports for ``error``: ``"<code>: <message>"``."""
    return f"{error.code}: {error}"
