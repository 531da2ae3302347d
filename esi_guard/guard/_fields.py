"""The guard's settings: every field of :class:`~esi_guard.ESIGuard`, each with what it does.

``ESIGuard`` derives from :class:`GuardFields` (as LangChain's ``ChatOpenAI`` from
``BaseChatOpenAI``): the settings here, the behaviour in :mod:`esi_guard.guard.chat_model`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable
from pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from esi_guard import _retired
from esi_guard.backends.base import Backend
from esi_guard.backends.embedded import EmbeddedBackend
from esi_guard.backends.hidden import HiddenSpec
from esi_guard.cascade import Band, Cascade, ESIProbe
from esi_guard.combined import CombinedScore
from esi_guard.guard import _config
from esi_guard.guard._checks import checked
from esi_guard.guard._prompt import CalibratedPrompt, check_template
from esi_guard.interventions import Intervention, SkipOneChar
from esi_guard.policy import Policy, granularity
from esi_guard.result import DEFAULT_MAX_NEW_TOKENS, Action, OnError, ScoringConfig
from esi_guard.scoring import Distance, Support

__all__ = ["DEFAULT_ABSTAIN_MESSAGE", "GuardFields"]

DEFAULT_ABSTAIN_MESSAGE = "I am not confident enough to answer that reliably."

_RETIRED = ("min_variants", "stop_constant")
"""Settings of modes retired in 0.2.0: an error naming what replaces them when given."""


class GuardFields(BaseChatModel):
    """The settings of :class:`~esi_guard.ESIGuard` and their checks (see its docstring)."""

    backend: Backend = Field(default_factory=EmbeddedBackend)
    """The model engine (``HFBackend``, ``OpenAIBackend``...). Default: the small embedded
    model, loaded on first use and shared by every guard that uses it (for trying the
    guard; pass your own model with ``llm=`` or ``backend=``)."""
    llm: Any = Field(default=None, exclude=True, repr=False)
    """The model object you already have (a model id, a transformers pipeline,
    ``HuggingFacePipeline``, ``ChatHuggingFace``, ``ChatOpenAI``...): the guard builds its
    backend from it, sharing the loaded weights (see :mod:`esi_guard.backends.adapters`)."""
    n_threads: int | None = Field(default=None, ge=1, exclude=True, repr=False)
    """CPU threads of the model the guard runs (None: the engine's own choice, every core
    for llama.cpp's teacher forcing), for a model it loads or shares: ``llm=`` a path, a
    hub id or ``"default"``, a loaded ``llama_cpp.Llama`` (or LangChain's ``ChatLlamaCpp``
    / ``LlamaCpp``), or no model (the embedded one: guards asking for the same threads
    share a copy). llama.cpp applies them to every decode of the backend's contexts, its
    float16 forcing copy's included; transformers (a path it loads, a pipeline, a model
    and tokenizer) through ``torch.set_num_threads``, for the whole process. A
    ``backend=`` or an API client (``ChatOpenAI``) is refused with them
    (:class:`ConfigurationError`): build the backend with its own threads
    (``LlamaCppBackend.from_path(..., n_threads=N)``). Give fewer than the cores where
    several guards' processes share them: llama.cpp's waiting threads spin, and
    processes each using every core slow each other down several times over. Scores do
    not depend on it (llama.cpp sums each output on one thread: 1 and 2 threads give the
    embedded model's answers and scores to the bit), so a threshold file ignores it."""
    threshold: float
    """Scores strictly above it are untrusted; calibrate it on labelled data. Left out with
    the embedded default model, it comes from that model's shipped calibration (with the
    scoring settings it was fitted with); any other model needs one."""
    intervention: Intervention = Field(default_factory=SkipOneChar)
    """How variants of the question are made (SOC with p=0.3, M*=3 by default)."""
    n_variants: int = Field(default=10, ge=1)
    """L, the number of intervened variants per question."""
    top_k: int = Field(default=100, ge=1)
    """k, the number of tokens kept in each truncated distribution."""
    distance: Distance = "hellinger"
    """Distance between truncated distributions."""
    support: Support = "pair"
    """The tokens two truncated distributions are compared on: the union of their own
    top-k sets (``"pair"``), or of all the answer's distributions (``"all"``, as the
    authors' code). See :func:`~esi_guard.esi_score`."""
    action: Action = "flag"
    """What to do with an untrusted answer: ``flag``, ``abstain``, ``route``, or
    ``redact``: remove the sentences whose score is past the threshold (each answer is
    then decided on its sentences, ``ESIResult.sentences``; the metadata's ``redacted``
    lists what was removed and why; an answer with nothing left is an abstention)."""
    fallback: Runnable[Any, Any] | None = None
    """Runnable invoked with the original input when ``action="route"``."""
    abstain_message: str = DEFAULT_ABSTAIN_MESSAGE
    """Content returned in place of an untrusted answer when ``action="abstain"``."""
    max_new_tokens: int = Field(default=DEFAULT_MAX_NEW_TOKENS, ge=1, alias="max_tokens")
    """Most tokens generated per answer (``max_tokens``, LangChain's name, works too)."""
    seed: int = 0
    """Seed of the intervention; variants depend only on it and the question."""
    on_error: OnError = "abstain"
    """What to do with an answer that cannot be scored: ``abstain``, ``flag`` or ``raise``."""
    decide_on: Literal["esi", "sentences"] = "esi"
    """The signal compared with ``threshold``: the ESI ``score`` (default; untrusted
    above it), or ``sentences``: each sentence's own score (``ESIResult.sentences``), the
    answer untrusted when any sentence is past ``sentence_threshold`` (a backend that
    cannot map tokens to text leaves every answer unscored). ``context_reliance`` was
    retired in 0.2.0 (a :class:`ConfigurationError` says why)."""
    sentence_threshold: float | None = None
    """The threshold of each sentence's score (its ESI, or with a combined score its
    ``p_wrong``); None: ``threshold``. ``esi-guard calibrate --granularity sentence``
    fits one."""
    combined: CombinedScore | None = None
    """A combined score (``esi-guard calibrate --score combined`` fits one; a threshold
    file carries it to ``from_calibration``): decisions are then made on its ``p_wrong``,
    from ESI and the answer's free signals, and ``threshold`` is a probability. One with a
    hidden-state probe needs a backend that gives hidden states (transformers, llama.cpp)."""
    hidden_states: HiddenSpec | None = None
    """Also read these hidden states with every answer (from its own forward passes) and
    keep them in its result (``ESIResult.hidden``): what ``esi-guard calibrate --features
    ...,hidden`` fits a probe on. Needs a backend that gives them."""
    esi_probe: ESIProbe | None = None
    """An ESI probe (``esi-guard distill`` writes one; a path is read): a cascade then
    decides each answer on the probe's estimate of ESI (or, with ``combined``, on
    ``p_wrong`` with that estimate) where it is outside ``probe_band``, and runs ESI only
    inside it (``ESIResult.decided_by``). Needs the backend the probe was distilled on."""
    probe_band: Band | None = None
    """Where the cascade's cheap score is too close to the threshold and ESI runs. None
    (deciding on ESI): fitted at the threshold on the probe's held-out distillation
    answers, so that its decisions differ from full ESI's on at most
    ``probe_disagreement`` of them with probability 0.9 (no labels needed); a threshold
    file calibrated with ``--esi-probe`` carries one fitted on labelled answers."""
    probe_disagreement: float = Field(default=0.02, gt=0, lt=1)
    """The share of decisions a label-free band may change against full ESI."""
    free_score: CombinedScore | None = None
    """A value-of-information cascade's cheap score: a combined score fitted without ESI
    (``esi-guard calibrate --score combined --cascade`` writes it, with its ``probe_band``,
    into the threshold file). Where its ``p_wrong`` is outside ``probe_band`` it decides
    (``decided_by="free"``, no variant forced); inside it, ESI runs and ``combined``
    decides."""

    stop: list[str] | None = None
    """Stop sequences: an answer ends before the first one (a call's ``stop`` wins)."""
    system_prompt: str | None = None
    """A system message put first in every prompt that has none (a prompt with its own
    keeps it). ``from_calibration`` sets the threshold file's, the one its questions were
    asked under: scores depend on the prompt."""
    prompt_template: str | None = None
    """A template (``{question}`` its one variable) that a prompt's question message is
    rendered with, only ``{question}`` intervened on; a prompt from ``with_prompt`` keeps
    its own. ``from_calibration`` sets the file's (a template with ``{context}`` is
    ``with_prompt``'s to render)."""
    temperature: float | None = None
    """Only ``0`` or ``None``: ESI scores the greedy answer, so the guard never samples."""
    stream_mode: Literal["hold", "live", "sentences"] = "hold"
    """``hold``: ``stream`` yields the answer once it is scored. ``live``: it yields the
    answer's text as it is generated, then a last chunk with the score and metadata; only
    with ``action="flag"`` and ``on_error`` ``"flag"`` or ``"raise"``, since an answer
    already shown cannot be withheld. ``sentences``: it yields each sentence once it is
    scored (its tokens forced after the variants while the answer is still generated,
    the backend's forcing session keeping the variants' state between sentences), with
    its score in the chunk's ``response_metadata["esi"]["shown"]`` (a one-item list, so
    that adding the chunks, as LangChain does, lists every sentence shown); a shown
    sentence has been checked. A sentence past ``sentence_threshold`` is never shown:
    with ``action="redact"`` it is dropped and the stream goes on; with ``flag``,
    ``abstain`` or ``route`` it and every sentence after it are withheld, and the last
    chunk carries nothing more of the answer (``flag``), the abstain message
    (``abstain``) or the fallback's answer (``route``); the sentences shown before it
    stay shown. Fail closed: a sentence that could not be scored is never shown, and an
    answer that could not be scored shows none (whatever ``on_error``; the last chunk's
    metadata says why). The last chunk's ``response_metadata["esi"]`` is the whole
    answer's, as a non-streamed call gives it (``sentences`` included), and its scores
    are those of the same guard's ``invoke`` up to the engine's rounding. Needs what
    deciding on sentences needs (no cascade or probe) and
    ``support="pair"``. ``invoke`` is not streamed and is the non-streamed call."""
    streaming: bool = False
    """LangChain's flag: ``invoke`` goes through ``_stream`` (still one chunk, when scored)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid", populate_by_name=True)
    _warned: bool = PrivateAttr(default=False)
    _calibrated_prompt: CalibratedPrompt | None = PrivateAttr(default=None)
    _prompt_warned: bool = PrivateAttr(default=False)
    _cascade: Cascade | None = PrivateAttr(default=None)
    _threshold_source: str = PrivateAttr(default="given")

    def __init__(self, **kwargs: Any) -> None:
        """Validate the configuration; any invalid or unknown field is a ConfigurationError."""
        kwargs = _retired.check(kwargs, _RETIRED, "ESIGuard")
        kwargs, shipped = _config.given_settings(kwargs)
        if kwargs.get("decide_on") == "context_reliance":
            error = _retired.retired("context_reliance", "ESIGuard")
            raise error
        try:
            super().__init__(**kwargs)
        except ValidationError as exc:
            own = set(type(self).model_fields) - set(BaseChatModel.model_fields)
            raise _config.configuration_error(exc, [*own, "max_tokens"]) from exc
        if shipped is not None:
            _config.check_file_match(shipped, self, stacklevel=2)
            self._threshold_source = shipped.source

    @property
    def threshold_source(self) -> str:
        """Where ``threshold`` came from; every result reports it.

        ``"given"`` (``threshold=``), ``"file:<path>"`` (:meth:`from_calibration`) or
        ``"shipped:<file>"`` (the model's shipped calibration, used when no threshold is given).
        """
        return self._threshold_source

    @model_validator(mode="before")
    @classmethod
    def _one_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and {"max_tokens", "max_new_tokens"} <= data.keys():
            msg = "max_tokens and max_new_tokens are one setting: give one of them"
            raise ValueError(msg)
        return data

    @field_validator("prompt_template")
    @classmethod
    def _one_variable(cls, value: str | None) -> str | None:
        return check_template(value)

    @field_validator("esi_probe", mode="before")
    @classmethod
    def _read_probe(cls, value: Any) -> Any:
        return ESIProbe.read(value) if isinstance(value, (str, Path)) else value

    @model_validator(mode="after")
    def _check(self) -> GuardFields:
        """Refuse settings that cannot work together (a :class:`ConfigurationError` saying why)."""
        self._cascade = checked(self)
        self.policy  # noqa: B018  (built once here: a policy that cannot decide is refused)
        return self

    @property
    def policy(self) -> Policy:
        """The stages that decide each answer, in order (``policy.describe()`` shows them).

        Built from the current settings at each call (a copy with other settings has its own).
        """
        sentences = granularity(self.action, self.decide_on, self.stream_mode)
        return Policy.of(self.threshold, combined=self.combined, cascade=self._cascade,
                         granularity=sentences)  # fmt: skip

    @property
    def scoring_config(self) -> ScoringConfig:
        """How this guard computes scores (what a threshold file must match)."""
        return ScoringConfig(
            intervention=self.intervention.describe(),
            n_variants=self.n_variants,
            top_k=self.top_k,
            distance=self.distance,
            support=self.support,
            values=self.backend.values_kind,
            approximate=self.backend.approximate,
            seed=self.seed,
            max_new_tokens=self.max_new_tokens,
        )
