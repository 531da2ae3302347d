"""A guard's settings from a threshold file (given or shipped); pydantic's errors in one line."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from pydantic import ValidationError

from esi_guard._keywords import unknown_keyword
from esi_guard.backends.adapters import backend_for
from esi_guard.backends.base import states_engine
from esi_guard.backends.embedded import EmbeddedBackend
from esi_guard.calibration.file import ThresholdFile
from esi_guard.exceptions import ConfigurationError, EngineMismatchWarning, PromptMismatchWarning
from esi_guard.guard._prompt import PROMPT_ADVICE, CalibratedPrompt, fields_of
from esi_guard.guard._shipped import shipped_for
from esi_guard.interventions import rebuild_intervention
from esi_guard.policy import granularity
from esi_guard.result import ScoringConfig

if TYPE_CHECKING:
    from esi_guard.backends.base import Backend
    from esi_guard.cascade import ESIProbe
    from esi_guard.interventions import Intervention

__all__ = [
    "FileSettings",
    "check_file_match",
    "configuration_error",
    "file_settings",
    "from_threshold_file",
    "given_settings",
    "shipped_settings",
]


class Guard(Protocol):
    """What a threshold file is checked against: a guard's scoring and backend."""

    @property
    def scoring_config(self) -> ScoringConfig: ...

    @property
    def backend(self) -> Backend: ...

    @property
    def decide_on(self) -> str: ...


class Prompted(Guard, Protocol):
    """A guard that keeps the prompt its threshold was calibrated under, to check calls."""

    _calibrated_prompt: CalibratedPrompt | None
    _prompt_warned: bool
    _threshold_source: str


G = TypeVar("G", bound=Prompted)


class FileSettings(NamedTuple):
    """A guard's keyword arguments from a threshold file, and what to check once it exists."""

    kwargs: dict[str, Any]
    """The file's threshold and scoring settings, completed or overridden by the keywords given."""
    calibrated: ThresholdFile
    expected: ScoringConfig
    """The scoring configuration the guard must have for the file's threshold to hold."""
    where: str
    """The file, as messages name it."""
    hint: str = ""
    """Appended to a mismatch's message."""
    source: str = ""
    """Where the threshold came from, as results report it (``threshold_source``)."""


_FILE_OPTIONS = ("n_variants", "top_k", "distance", "support", "seed", "max_new_tokens")


def file_settings(
    calibrated: ThresholdFile, given: dict[str, Any], where: str, hint: str = ""
) -> FileSettings:
    """The guard's keywords: the file's settings, those in ``given`` taking their place.

    A differing one is refused later by :func:`check_file_match`; ``combined`` comes only from the
    file (its threshold is on that score).
    """
    given = dict(given)
    if "max_tokens" in given:  # LangChain's name for max_new_tokens
        given["max_new_tokens"] = given.pop("max_tokens")
    if given.get("threshold") is not None:
        msg = (
            f"the threshold comes from {where} ({calibrated.threshold:g}, on the scores it was "
            "calibrated for): do not pass threshold=, or give ESIGuard(threshold=...) instead"
        )
        raise ConfigurationError(msg)
    given.pop("threshold", None)
    if "combined" in given:
        msg = (
            "combined comes from the threshold file (its threshold is on that score's "
            "p_wrong, or on ESI when the file has none): do not pass it"
        )
        raise ConfigurationError(msg)
    expected = calibrated.scoring
    settings = {key: given.pop(key, getattr(expected, key)) for key in _FILE_OPTIONS}
    settings["decide_on"] = given.pop("decide_on", _decides_on(calibrated))
    settings["threshold"] = calibrated.threshold
    if calibrated.combined is not None:
        settings["combined"] = calibrated.combined
    if calibrated.free_score is not None:
        settings["free_score"] = given.pop("free_score", calibrated.free_score)
        settings["probe_band"] = given.pop("probe_band", calibrated.probe_band)
    if calibrated.esi_probe is not None:
        settings["esi_probe"] = given.pop("esi_probe", calibrated.esi_probe)
        settings["probe_band"] = given.pop("probe_band", calibrated.probe_band)
    if given.get("intervention") is None:
        given["intervention"] = rebuild_intervention(expected.intervention)
        # A file older than some of the intervention's options names fewer of them.
        expected = expected.model_copy(update={"intervention": given["intervention"].describe()})
    return FileSettings({**settings, **given}, calibrated, expected, where, hint)


def _decides_on(calibrated: ThresholdFile) -> str:
    """What a file's threshold applies to: each sentence's ESI, or the answer's score."""
    return "sentences" if calibrated.granularity == "sentence" else "esi"


def check_file_match(settings: FileSettings, guard: Guard, stacklevel: int) -> None:
    """Refuse a guard whose model or scoring differs from the file's; warn on another engine.

    Another engine gets an :class:`EngineMismatchWarning`, or is refused if the file holds a
    hidden-state probe (the engines' states differ).
    """
    calibrated = settings.calibrated
    problems = settings.expected.score_differences(guard.scoring_config)
    # A sentence file's threshold is on sentences only; an answer file's ESI threshold also
    # judges each sentence (a sentence's ESI is on the answer's scale), as redact does.
    if calibrated.granularity == "sentence" and guard.decide_on != "sentences":
        problems.append(f"decide_on: 'sentences' vs {guard.decide_on!r}")
    if (different_model := model_difference(calibrated, guard.backend)) is not None:
        problems.insert(0, different_model)
    if problems:
        msg = (
            f"{settings.where} does not match this guard (calibrated vs given): "
            + "; ".join(problems)
            + settings.hint
        )
        raise ConfigurationError(msg)
    other_engine = engine_difference(calibrated, guard.backend, settings.where)
    probe = any(
        c is not None and c.hidden is not None for c in (calibrated.combined, calibrated.free_score)
    )
    if (
        other_engine is not None
        and probe
        and states_engine(calibrated.engine or "") != (states_engine(guard.backend.engine))
    ):
        msg = (
            f"{settings.where} holds a hidden-state probe fitted on the {calibrated.engine} "
            f"engine; this guard runs {guard.backend.engine}, whose hidden states of the same "
            "weights differ (by ~1% on the embedded model): calibrate on this engine"
        )
        raise ConfigurationError(msg)
    if other_engine is not None:
        warnings.warn(other_engine, EngineMismatchWarning, stacklevel=stacklevel + 1)


def from_threshold_file(
    cls: Callable[..., G],
    path: str | Path,
    *,
    backend: Backend | None = None,
    intervention: Intervention | None = None,
    **kwargs: Any,
) -> G:
    """A guard built by ``cls`` from the file: see :meth:`esi_guard.ESIGuard.from_calibration`.

    It asks under the file's prompt unless ``kwargs`` overrides it (:class:`PromptMismatchWarning`);
    a template with ``{context}`` is left to ``with_prompt``.
    """
    calibrated = ThresholdFile.read(path)
    where = f"threshold file {path}"
    prompt = CalibratedPrompt(
        calibrated.scoring.system_prompt, calibrated.scoring.prompt_template, where
    )
    template = prompt.template
    asked = {
        "system_prompt": prompt.system,
        "prompt_template": template if template and fields_of(template) == ["question"] else None,
    }
    given = {**asked, **kwargs, "intervention": intervention}
    if backend is not None:
        given["backend"] = backend
    settings = file_settings(calibrated, given, where)
    guard = cls(**settings.kwargs)
    check_file_match(settings, guard, stacklevel=3)
    guard._calibrated_prompt = prompt
    guard._threshold_source = f"file:{path}"
    overridden = [
        f"{name}={kwargs[name]!r} where the file has {theirs!r}"
        for name, theirs in (("system_prompt", prompt.system), ("prompt_template", template))
        if name in kwargs and kwargs[name] != theirs
    ]
    if overridden:
        msg = (
            f"{where} was calibrated under another prompt than this guard asks under: "
            + "; ".join(overridden)
            + PROMPT_ADVICE
        )
        warnings.warn(msg, PromptMismatchWarning, stacklevel=3)
        guard._prompt_warned = True
    return guard


def model_difference(calibrated: ThresholdFile | ESIProbe, backend: Backend) -> str | None:
    """Why the file's model is not the backend's (by digest, else ``model_id``); None: it is."""
    theirs = calibrated.model_sha256
    ours = backend.model_sha256 if theirs is not None else None
    if theirs is not None and ours is not None:
        if theirs == ours:
            return None
        return (
            f"model: {calibrated.model!r} (sha256 {theirs[:16]}...) vs {backend.model_id!r} "
            f"(sha256 {ours[:16]}...): a digest mismatch means different weights (another "
            "file, quantization or fine-tune); calibrate on these weights"
        )
    if calibrated.model == backend.model_id:
        return None
    return (
        f"model: {calibrated.model!r} vs {backend.model_id!r}: if these are the same weights "
        f"named differently, pass model_id={calibrated.model!r} to the backend "
        "(HFBackend, LlamaCppBackend or OpenAIBackend(..., model_id=...), given as "
        "backend=...); otherwise calibrate on this model"
    )


def engine_difference(calibrated: ThresholdFile, backend: Backend, where: str) -> str | None:
    """The :class:`EngineMismatchWarning`'s message, or None: same engine, or not recorded."""
    if calibrated.engine is None or calibrated.engine == backend.engine:
        return None
    engine = backend.engine
    again = (
        f"`esi-guard calibrate --backend {states_engine(engine)}`"
        if states_engine(engine) in ("transformers", "llamacpp")
        else "`esi-guard calibrate` on this backend"
    )
    return (
        f"{where} was calibrated on the {calibrated.engine} engine and this "
        f"guard runs {engine}: the same weights give close, not identical scores (on the "
        "embedded model, transformers and llama.cpp agree to within 0.005 on average where "
        "their greedy answers match, Spearman 0.99), so the threshold holds approximately. "
        f"Recalibrate with {again}, or silence this with warnings.filterwarnings('ignore', "
        "category=esi_guard.EngineMismatchWarning)"
    )


def given_settings(kwargs: dict[str, Any]) -> tuple[dict[str, Any], FileSettings | None]:
    """ESIGuard's keywords before validation, and the shipped file's settings if it uses them.

    ``llm=`` (or, with ``n_threads``, no model) becomes the backend; ``backend=`` with ``n_threads``
    is refused. No ``threshold`` means the model's shipped one (:func:`shipped_settings`).
    """
    kwargs = dict(kwargs)
    threads = kwargs.get("n_threads")
    if kwargs.get("llm") is not None:
        if kwargs.get("backend") is not None:
            msg = "give backend= or llm=, not both"
            raise ConfigurationError(msg)
        kwargs["backend"] = backend_for(kwargs["llm"], n_threads=threads)
    elif threads is not None:
        given = kwargs.get("backend")
        kwargs["backend"] = (
            EmbeddedBackend(n_threads=threads)
            if given is None
            else backend_for(given, n_threads=threads)  # a ConfigurationError saying why
        )
    if kwargs.get("threshold") is not None:
        return kwargs, None
    kwargs.pop("threshold", None)
    shipped = shipped_settings(kwargs)
    return shipped.kwargs, shipped


def shipped_settings(kwargs: dict[str, Any], path: str | Path | None = None) -> FileSettings:
    """:func:`file_settings` of the model's shipped calibration (no ``threshold`` given).

    The file is :func:`~esi_guard.guard._shipped.shipped_for` the backend, or ``path``; a scoring
    setting that differs from it is refused by :func:`check_file_match`.
    """
    if path is None:
        asked = (kwargs.get(key, "") for key in ("action", "decide_on", "stream_mode"))
        judged = granularity(*asked)  # a setting not given is not a sentence one
        found = shipped_for(kwargs.get("backend"), judged)
        path, source = found.path, found.source
        where = f"the shipped calibration {found.path.name}"
    else:
        source, where = f"shipped:{Path(path).name}", f"the shipped calibration {path}"
    hint = "; with other settings give threshold=... (calibrate one: esi-guard calibrate)"
    calibrated = ThresholdFile.read(path)
    return file_settings(calibrated, kwargs, where, hint)._replace(source=source)


def configuration_error(exc: ValidationError, own: Iterable[str]) -> ConfigurationError:
    """Pydantic's report on ESIGuard in one line: the first problem, by field, with its value."""
    errors = exc.errors()
    extra = [e["loc"][0] for e in errors if e["type"] == "extra_forbidden"]
    if extra:
        return unknown_keyword("ESIGuard", str(extra[0]), list(own))
    first = errors[0]
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, ConfigurationError):  # raised by a validator: already one line
        return cause
    field = ".".join(str(part) for part in first["loc"]) or "settings"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    given = f", got {first['input']!r}" if first["type"] != "missing" else ""
    msg = f"invalid ESIGuard setting {field}: {first['msg'].lower()}{given}{more}"
    return ConfigurationError(msg)
