"""ESI only where the decision needs it: a label-free ESI probe, and the cascade it drives.

An :class:`ESIProbe` reads ESI off what the answer's own pass already holds: its free
signals (``nll``, ``entropy``, ``max_nll``, :func:`~esi_guard.combined.free_signals`)
and its hidden states (:class:`~esi_guard.backends.hidden.HiddenStates`). It is a ridge
regression on the standardised signals and the PCA components of one layer's states at
some positions, fitted to the full-L ESI scores of *unlabelled* questions
(:func:`~esi_guard.calibration.cascade_fit.fit_esi_probe`; ``esi-guard distill``), its
layer, positions, PCA size and strength chosen by cross-validated squared error.
Standardising, PCA and the regression are linear, so it is folded into plain numbers:
``intercept + w . z(signals) + v . states``, one portable JSON file. Its cost at run
time is a dot product.

A :class:`Cascade` decides on a cheap score where that score is far enough from the
threshold and lets full ESI decide elsewhere. The cheap score is the probe's estimate of
ESI (a guard deciding on ESI; the cascade on a combined score's ``p_wrong`` was retired in
0.2.0: the value cascade decides such guards), or, in a value cascade, a combined score
fitted without ESI. ESI runs when the cheap score falls in ``[low, high]``; below it the
answer is accepted, above it the guard's action is taken. The band comes either from
the probe alone (the threshold +- :attr:`ESIProbe.band`, the held-out quantile of
``|ESI - estimate|`` at the probe's ``coverage``: no labels needed) or from calibration
data (:func:`~esi_guard.calibration.cascade_fit.fit_band`, ``esi-guard calibrate
--esi-probe``): the narrowest band, of a family growing around the threshold, whose
decisions differ from full-ESI decisions on at most ``max_disagreement`` of the answers
with confidence ``1 - delta`` (one-sided Clopper-Pearson, bands tested from the widest
inwards, a fixed sequence, so no level is spent on the search).

This module holds the cascade's parts (the policy's stages decide with them); the
fitting lives in :mod:`esi_guard.calibration.cascade_fit`. Pure: numpy, no model, no
LangChain.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from esi_guard._files import read_model
from esi_guard._retired import retired
from esi_guard.backends.hidden import HiddenSpec, HiddenStates, merged
from esi_guard.combined import CombinedScore, HiddenProbe
from esi_guard.exceptions import ConfigurationError
from esi_guard.result import ScoringConfig

__all__ = [
    "ESI_PROBE_FORMAT",
    "PROBE_SIGNALS",
    "Band",
    "Cascade",
    "ESIProbe",
]

ESI_PROBE_FORMAT = "esi-guard/esi-probe"

PROBE_SIGNALS = ("nll", "entropy", "max_nll")
"""The free signals an ESI probe reads by default (ESI is entropy-weighted: mean token
entropy alone has a Spearman of ~0.8 with it on the embedded model)."""


class ESIProbe(BaseModel):
    """``estimate = intercept + sum_i w_i * (signal_i - mean_i) / scale_i [+ v . states]``.

    Fitted to full-L ESI scores by :func:`~esi_guard.calibration.cascade_fit.fit_esi_probe`;
    written by ``esi-guard distill``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["esi-guard/esi-probe"] = "esi-guard/esi-probe"
    version: Literal[1] = 1
    model: str = ""
    """The backend's ``model_id`` it was distilled on."""
    model_sha256: str | None = None
    """The weights' digest (a GGUF's) where the backend has one."""
    engine: str | None = None
    """The engine whose states it reads (``llamacpp``, ``transformers``)."""
    scoring: ScoringConfig | None = None
    """The ESI it estimates: L, k, distance, intervention... (a guard must match it)."""
    features: tuple[str, ...] = PROBE_SIGNALS
    """The free signals it reads."""
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    intercept: float
    strength: float
    """The L2 strength cross-validation chose."""
    hidden: HiddenProbe | None = None
    """The states' term (its ``selection``: held-out mean squared error per candidate)."""
    band: float = Field(ge=0)
    """Held-out quantile of ``|ESI - estimate|`` at ``coverage``: a label-free cascade
    runs ESI where the estimate is within this of the threshold."""
    coverage: float = Field(gt=0, lt=1)
    n_fit: int
    """Answers it was fitted on."""
    quality: dict[str, Any] = {}
    """Held out (nested cross-validation): ``spearman`` and ``r2`` with their 95%
    intervals, ``n``; ``signals_only``: the same for a probe on the free signals alone."""
    held_out_estimates: tuple[float, ...] = ()
    """The distillation answers' estimates by probes fitted without them (nested
    cross-validation), beside :attr:`held_out_esi`: what a label-free cascade certifies
    its band on, at whatever threshold the guard has."""
    held_out_esi: tuple[float, ...] = ()
    """Those answers' full-L ESI scores."""
    created: str | None = None
    esi_guard_version: str | None = None

    @property
    def needs_hidden(self) -> HiddenSpec | None:
        """The states a backend must read for it; None: none."""
        return None if self.hidden is None else self.hidden.spec

    def estimate(self, signals: Mapping[str, float], hidden: HiddenStates | None = None) -> float:
        """The answer's estimated ESI score."""
        missing = [name for name in self.features if name not in signals]
        if missing:
            msg = f"the ESI probe needs the signals {missing} (got {sorted(signals)})"
            raise ConfigurationError(msg)
        x = (np.array([signals[n] for n in self.features]) - self.mean) / np.array(self.scale)
        value = self.intercept + float(np.dot(self.weights, x))
        if self.hidden is not None:
            if hidden is None:
                msg = "the ESI probe reads hidden states and got none"
                raise ConfigurationError(msg)
            value += self.hidden.term(hidden)
        return value

    def write(self, path: str | Path) -> None:
        """Write as indented JSON."""
        Path(path).write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: str | Path) -> ESIProbe:
        """Read and validate; every problem is a :class:`ConfigurationError` naming the file."""
        return read_model(cls, path, name="ESI probe file", kind="an esi-guard ESI probe",
                          file_format=ESI_PROBE_FORMAT,
                          hint="; `esi-guard distill` writes one")  # fmt: skip


class Band(BaseModel):
    """Where the cheap score is too close to the threshold to decide on: ESI runs there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    low: float
    high: float
    fitted: dict[str, Any] | None = None
    """From :func:`~esi_guard.calibration.cascade_fit.fit_band`: ``disagreement`` (cascade
    vs full-ESI decisions on the calibration answers), its upper ``bound`` at ``1 -
    delta``, ``max_disagreement``, ``delta``, ``esi_share`` (answers that ran ESI),
    ``n``. None: from the probe's own band (label-free)."""


class Cascade(BaseModel):
    """The cheap score (a probe, or a no-ESI combined score) and its band, as files hold them.

    The guard decides with it as a stage before ESI (:meth:`esi_guard.policy.Policy.of`:
    :class:`~esi_guard.policy.Stage` reads the cheap score and routes on the band).

    Two kinds: with ``probe`` (an ESI-probe cascade) the cheap score is the probe's
    estimate of ESI, for a guard deciding on ESI; with ``free`` (a value-of-information
    cascade, ``esi-guard calibrate --cascade``) it is the ``p_wrong`` of a combined score
    fitted without ESI, and where it falls inside the band ESI runs and ``combined``
    (fitted with ESI) decides.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    probe: ESIProbe | None = None
    band: Band
    combined: CombinedScore | None = None
    """With ``free``: what decides inside the band (a combined score with ESI)."""
    free: CombinedScore | None = None
    """A value-of-information cascade's cheap score: a combined score without ESI."""

    @model_validator(mode="after")
    def _one_cheap_score(self) -> Cascade:
        if (self.probe is None) == (self.free is None):
            msg = "a cascade has either an ESI probe or a no-ESI combined score (free)"
            raise ValueError(msg)
        if self.free is not None and ("esi" in self.free.features or self.combined is None):
            msg = "a value-of-information cascade needs free without esi, and combined with it"
            raise ValueError(msg)
        if self.probe is not None and self.combined is not None:
            error = retired("esi_probe_on_combined")
            raise error
        return self

    @property
    def needs_hidden(self) -> HiddenSpec | None:
        """The states the cheap score reads (the probe's, and the combined scores')."""
        scores = (self.probe, self.combined, self.free)
        return merged(*(score.needs_hidden for score in scores if score is not None))
