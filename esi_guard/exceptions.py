"""The whole esi_guard error tree.

Every error the library raises on purpose is an ``ESIGuardError``::

    ESIGuardError
    ├── ConfigurationError   bad parameters, missing extras' settings, no chat template
    ├── InputError           an input the guard cannot score (type, empty question)
    ├── ScoringError         an answer that cannot be scored          scoring_error
    │                        (NaN/inf, shapes; also empty_answer, no_effective_variant)
    ├── UncertainAnswerError an agent's answer scored past the threshold, with
    │                        ``ESIMiddleware(action="raise")`` (``result``, ``message``)
    └── BackendError         the engine failed (forward pass, server)  backend_error
        ├── ModelLoadError   the model or tokenizer could not be loaded
        ├── ContextLengthError  the prompt (and answer) do not fit     context_overflow
        │   └── APIContextLengthError  (also an APIError) a server's HTTP 400 about it
        ├── OutOfMemoryError    the device ran out of memory for one prompt alone
        │                                                           out_of_memory
        ├── InterventionError   the intervention failed (a paraphrasing LLM)
        │                                                           intervention_error
        └── APIError         an OpenAI-compatible server failed or answered badly
                             (``retryable``, ``status_code``, ``original``)

``ConfigurationError`` and ``InputError`` are also ``ValueError`` so that code written
against plain Python conventions keeps working.

The right-hand column is each class's ``code``: an unscored answer's ``reason`` is
``"<code>: <message>"`` of the error that stopped it (:func:`reason`). Errors are
recognised by their type, never by their message text.

A high ESI score is a *result*, not an exception: the guard reports it in the
answer's metadata and acts on it (flag, abstain, route). The one exception is the agent
middleware's ``action="raise"``, which exists so that a middleware listed before it
(LangChain's ``ModelFallbackMiddleware``) can take over. An answer that cannot be
scored follows the guard's ``on_error`` policy: withheld (``abstain``, the default) or
flagged with the reason in its metadata, or, with ``on_error="raise"``, one of these
errors (``ScoringError`` carries the unscored result in ``.result``).

Three warning classes (all ``UserWarning``), for what is not an error but is rarely what
the user meant:

* ``WholeMessageWarning``, issued once per guard when the text taken as the question is
  long (over 512 characters): the whole human message (instructions, retrieved passages)
  is being intervened on; ``ESIGuard.with_prompt`` intervenes on the question variable
  alone. ``esi-guard serve`` returns it to each caller instead (``whole_message`` in the
  response's ``esi.warnings``), not to its log.
* ``EngineMismatchWarning``, issued by ``ESIGuard.from_calibration`` when the threshold
  file was calibrated on another engine (transformers) than the guard runs (llama.cpp)
  for the same model: the scores are close, not identical.
* ``PromptMismatchWarning``, issued once per guard when it scores a prompt asked under
  another system prompt or template than its threshold file was calibrated under (given
  to ``from_calibration``, or sent by a chain at call time): the same question under
  another instruction gets another answer and another score, so the threshold holds
  only approximately, by an amount nothing here can measure without labels.
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
    """Distributions handed to the ESI estimator cannot be scored.

    Raised by the guard with ``on_error="raise"`` for an answer it could not score;
    ``result`` then holds that answer's unscored ``ESIResult`` (answer, reason), so
    nothing is lost.
    """

    code = "scoring_error"

    def __init__(
        self, message: str, *, result: object | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.result = result
        """The unscored ``ESIResult``, when the guard raised this; else None."""
        if code is not None:
            self.code = code  # empty_answer, no_effective_variant: finer than the class


class UncertainAnswerError(ESIGuardError):
    """An agent's final answer scored past the threshold (``ESIMiddleware(action="raise")``).

    Raised in place of the answer so that an outer middleware (LangChain's
    ``ModelFallbackMiddleware``) can hand the request to another model.
    """

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
    """A prompt, or a prompt plus its answer, is longer than the model's context window.

    The backend refuses it (nothing is truncated, since a cut prompt is another
    question); the other prompts of a batch go on. ``HFBackend`` checks the model's
    window itself; an API backend raises one (that is also an :class:`APIError`) when
    the server answers HTTP 400 about its context length.
    """

    code = "context_overflow"


class OutOfMemoryError(BackendError):
    """The device ran out of memory for one prompt, even in a pass of its own.

    ``HFBackend`` splits a batch that runs out of GPU memory and runs the halves; only a
    prompt that does not fit alone gets this error, in place (the others go on).
    """

    code = "out_of_memory"


class InterventionError(BackendError):
    """The intervention could not make the question's variants (a paraphrasing LLM failed).

    The guard wraps any exception an intervention raises in one, per batch of questions.
    """

    code = "intervention_error"


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


class APIContextLengthError(APIError, ContextLengthError):
    """A server's refusal (HTTP 400) of a prompt longer than its context: both errors at once."""

    code = "context_overflow"


def reason(error: ESIGuardError) -> str:
    """The ``reason`` an unscored result reports for ``error``: ``"<code>: <message>"``."""
    return f"{error.code}: {error}"
