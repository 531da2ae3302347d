"""The guard's probes checked against its backend: the combined score's and the cascade's.

``ESIGuard``'s validator calls :func:`check_hidden` (the backend gives the states a
combined score's hidden-state probe and ``hidden_states`` read) and :func:`guard_cascade`
(when ``esi_probe`` is set: refuses a probe distilled on another model or engine, for
another ESI, or one that needs hidden states from a backend that gives none, and builds
the :class:`~esi_guard.cascade.Cascade` the pipeline routes with). Each refusal is a
:class:`~esi_guard.exceptions.ConfigurationError` saying why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from esi_guard._retired import retired
from esi_guard.backends.base import states_engine
from esi_guard.backends.hidden import merged
from esi_guard.calibration.cascade_fit import label_free_band
from esi_guard.cascade import Band, Cascade, ESIProbe
from esi_guard.exceptions import ConfigurationError
from esi_guard.guard._config import model_difference

if TYPE_CHECKING:
    from esi_guard.backends.base import Backend
    from esi_guard.backends.hidden import HiddenSpec
    from esi_guard.combined import CombinedScore
    from esi_guard.result import ScoringConfig

__all__ = ["check_hidden", "guard_cascade", "probe_cascade"]

_IGNORED = ("system_prompt", "prompt_template")
"""Settings that do not change the ESI score a probe estimates."""


def probe_cascade(
    probe: ESIProbe,
    band: Band | None,
    *,
    backend: Backend,
    scoring: ScoringConfig,
    threshold: float,
    max_disagreement: float = 0.02,
) -> Cascade:
    """An ESI-probe cascade for these settings, or a ConfigurationError naming the misfit."""
    problems = []
    if (other := model_difference(probe, backend)) is not None:
        problems.append(other)
    if (
        probe.engine is not None
        and probe.hidden is not None
        and states_engine(probe.engine) != states_engine(backend.engine)
    ):
        problems.append(
            f"engine: the probe reads the {probe.engine} engine's hidden states and this "
            f"guard runs {backend.engine}, whose states of the same weights differ: distill "
            "on this engine"
        )
    if probe.scoring is not None:
        problems += probe.scoring.differences(scoring, ignore=_IGNORED)
    if problems:
        msg = "the ESI probe does not match this guard (distilled vs given): " + "; ".join(problems)
        raise ConfigurationError(msg)
    band = band or label_free_band(probe, threshold, max_disagreement=max_disagreement)
    if not band.low <= threshold <= band.high:
        msg = (
            f"the cascade's band [{band.low:g}, {band.high:g}] must hold the threshold "
            f"{threshold:g}"
        )
        raise ConfigurationError(msg)
    cascade = Cascade(probe=probe, band=band)
    needs = cascade.needs_hidden
    if needs is not None:
        try:
            backend.check_hidden(needs)
        except ConfigurationError as exc:
            msg = f"the ESI probe reads hidden states, which this backend cannot give: {exc}"
            raise ConfigurationError(msg) from exc
        width = backend.hidden_size
        hidden = probe.hidden
        if hidden is not None and width is not None and width != hidden.hidden_size:
            msg = (
                f"the ESI probe was distilled on states of width {hidden.hidden_size}; "
                f"{backend.model_id} gives {width}: another model"
            )
            raise ConfigurationError(msg)
    return cascade


def check_hidden(backend: Backend, combined: CombinedScore | None, keep: HiddenSpec | None) -> None:
    """The backend gives the hidden states the combined score's probe and ``keep`` read."""
    probe = None if combined is None else combined.hidden
    reads = merged(None if probe is None else probe.spec, keep)
    if reads is None:
        return
    try:
        backend.check_hidden(reads)
    except ConfigurationError as exc:
        what = "the combined score's hidden-state probe" if probe else "hidden_states"
        msg = f"{what} cannot be used with this backend: {exc}"
        raise ConfigurationError(msg) from exc
    size = backend.hidden_size
    if probe is not None and size is not None and size != probe.hidden_size:
        msg = (
            f"the hidden-state probe was fitted on states of width {probe.hidden_size}; "
            f"{backend.model_id} gives {size}: another model"
        )
        raise ConfigurationError(msg)


def guard_cascade(guard: Any) -> Cascade | None:
    """The cascade (of either kind) an ``ESIGuard``'s fields describe; None: none."""
    combined = guard.combined
    if combined is not None and not combined.uses_esi and (guard.esi_probe or guard.free_score):
        msg = (
            "the combined score reads no ESI: a cascade (esi_probe, free_score) has no ESI to spare"
        )
        raise ConfigurationError(msg)
    if guard.free_score is not None:
        return _free_cascade(guard)
    if guard.esi_probe is None:
        if guard.probe_band is not None:
            msg = "probe_band needs an esi_probe (esi-guard distill writes one)"
            raise ConfigurationError(msg)
        return None
    if guard.decide_on != "esi":
        msg = "a cascade estimates ESI: decide_on must stay 'esi'"
        raise ConfigurationError(msg)
    if guard.combined is not None:
        error = retired("esi_probe_on_combined", "ESIGuard")
        raise error
    return probe_cascade(guard.esi_probe, guard.probe_band, backend=guard.backend,
                         scoring=guard.scoring_config, threshold=guard.threshold,
                         max_disagreement=guard.probe_disagreement)  # fmt: skip


def _free_cascade(guard: Any) -> Cascade:
    """A value-of-information cascade: ``free_score`` outside ``probe_band``, else ESI."""
    free, band, combined = guard.free_score, guard.probe_band, guard.combined
    if guard.esi_probe is not None:
        msg = "free_score and esi_probe are two cascades: give one"
        raise ConfigurationError(msg)
    if combined is None or band is None or "esi" in free.features:
        msg = (
            "free_score (a combined score without esi) needs combined (with esi) and the "
            "probe_band fitted for it: `esi-guard calibrate --score combined --cascade` writes "
            "all three into the threshold file"
        )
        raise ConfigurationError(msg)
    if not band.low <= guard.threshold <= band.high:
        msg = (
            f"the cascade's band [{band.low:g}, {band.high:g}] must hold the threshold "
            f"{guard.threshold:g}"
        )
        raise ConfigurationError(msg)
    check_hidden(guard.backend, free, None)
    return Cascade(free=free, band=band, combined=combined)
