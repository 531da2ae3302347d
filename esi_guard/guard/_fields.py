"""The guard's settings: every field of :class:`~esi_guard.ESIGuard`, each with what it does.

``ESIGuard`` derives from :class:`GuardFields` as ``ChatOpenAI`` from ``BaseChatOpenAI``.
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
    """The model engine (``HFBackend``, ``OpenAIBackend``...). Default: the small embedded model,
    loaded on first use and shared by the guards using it (for trying; pass yours with ``llm=``
    or ``backend=``)."""
    llm: Any = Field(default=None, exclude=True, repr=False)
    """The model object you already have (a model id, a transformers pipeline, ``ChatOpenAI``...):
    the backend is built from it, sharing its weights (:mod:`esi_guard.backends.adapters`)."""
    n_threads: int | None = Field(default=None, ge=1, exclude=True, repr=False)
    """CPU threads of a model the guard loads or shares (None: the engine's choice): ``llm=`` a
    path, hub id, ``"default"`` or a loaded llama.cpp model, or no model (guards asking for the
    same threads share an embedded copy); transformers sets them process-wide. Refused with a
    ``backend=`` or an API client (:class:`ConfigurationError`): build the backend with its own.
    Give fewer than the cores where processes share them (llama.cpp's waiting threads spin).
    Scores do not depend on it, so a threshold file ignores it."""
    threshold: float
    """Scores strictly above it are untrusted; calibrate it on labelled data. Left out, it comes
    from the model's shipped calibration, scoring settings included, where the package ships one
    (the embedded model, and known GGUF files by digest); any other model needs one."""
    intervention: Intervention = Field(default_factory=SkipOneChar)
    """How variants of the question are made (SOC with p=0.3, M*=3 by default)."""
    n_variants: int = Field(default=10, ge=1)
    """L, the number of intervened variants per question."""
    top_k: int = Field(default=100, ge=1)
    """k, the number of tokens kept in each truncated distribution."""
    distance: Distance = "hellinger"
    """Distance between truncated distributions."""
    support: Support = "pair"
    """Tokens two truncated distributions are compared on: the union of their top-k sets
    (``"pair"``), or of all the answer's (``"all"``, as the authors' code). See
    :func:`~esi_guard.esi_score`."""
    action: Action = "flag"
    """What to do with an untrusted answer: ``flag``, ``abstain``, ``route``, or ``redact``: remove
    the sentences past the threshold (listed in the metadata's ``redacted``; none left: abstain)."""
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
    """The signal compared with ``threshold``: the ESI ``score``, or ``sentences``: untrusted when
    any sentence is past ``sentence_threshold`` (a backend that cannot map tokens to text leaves
    answers unscored). ``context_reliance`` is retired (a :class:`ConfigurationError` says why)."""
    sentence_threshold: float | None = None
    """The threshold of each sentence's ESI (or ``p_wrong``); None: ``threshold``.
    ``esi-guard calibrate --granularity sentence`` fits one."""
    combined: CombinedScore | None = None
    """A combined score (``esi-guard calibrate --score combined``): decisions are on its ``p_wrong``
    from ESI and free signals, ``threshold`` a probability. With a hidden-state probe it needs a
    backend that gives hidden states (transformers, llama.cpp)."""
    hidden_states: HiddenSpec | None = None
    """Hidden states to read with every answer and keep in ``ESIResult.hidden`` (for fitting a
    probe: ``esi-guard calibrate --features ...,hidden``). Needs a backend that gives them."""
    esi_probe: ESIProbe | None = None
    """An ESI probe (``esi-guard distill`` writes one; a path is read): a cascade decides on its
    ESI estimate outside ``probe_band`` and runs ESI only inside it (``ESIResult.decided_by``).
    Needs the backend the probe was distilled on."""
    probe_band: Band | None = None
    """Where the cascade's cheap score is too close to the threshold, so ESI runs. None: fitted
    without labels to change at most ``probe_disagreement`` of full ESI's decisions, with
    confidence 0.9."""
    probe_disagreement: float = Field(default=0.02, gt=0, lt=1)
    """The share of decisions a label-free band may change against full ESI."""
    free_score: CombinedScore | None = None
    """A value-of-information cascade's cheap score, a combined score without ESI (``esi-guard
    calibrate --score combined --cascade`` writes it): outside ``probe_band`` it decides
    (``decided_by="free"``); inside, ESI runs and ``combined`` decides."""

    stop: list[str] | None = None
    """Stop sequences: an answer ends before the first one (a call's ``stop`` wins)."""
    system_prompt: str | None = None
    """A system message put first in every prompt that has none. ``from_calibration`` sets the
    file's: scores depend on the prompt."""
    prompt_template: str | None = None
    """A template (``{question}`` its one variable) the question message is rendered with; a
    ``with_prompt`` prompt keeps its own. ``from_calibration`` sets the file's."""
    temperature: float | None = None
    """Only ``0`` or ``None``: ESI scores the greedy answer, so the guard never samples."""
    stream_mode: Literal["hold", "live", "sentences"] = "hold"
    """``hold``: ``stream`` yields the answer once scored. ``live``: its text as generated, then a
    last chunk with the score; only with ``action="flag"`` and ``on_error`` ``"flag"`` or
    ``"raise"`` (a shown answer cannot be withheld). ``sentences``: each sentence once scored,
    its score in ``response_metadata["esi"]["shown"]``. A sentence past ``sentence_threshold`` is
    never shown: ``redact`` drops it and goes on; other actions withhold it and all after it, the
    last chunk carrying no more text (``flag``), the abstain message or the fallback's answer.
    Fails closed: an unscored sentence or answer shows nothing, whatever ``on_error``. The last
    chunk's metadata is the whole answer's, as ``invoke`` gives it (up to the engine's rounding).
    Needs ``support="pair"`` and no cascade or probe."""
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
        """Where ``threshold`` came from: ``"given"``, ``"file:<path>"`` or ``"shipped:<file>"``."""
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
        """The stages that decide each answer, built from the current settings at each call."""
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
