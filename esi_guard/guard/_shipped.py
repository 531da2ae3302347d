"""The calibrations shipped with the package: a known model's threshold file, found by digest.

``ESIGuard()`` and ``ESIGuard(llm=...)`` without ``threshold`` use the file in
``esi_guard/shipped/`` whose ``model_sha256`` is their GGUF's digest (the embedded model's is
known by ``model_id``, unhashed); results name it in ``threshold_source`` (``"shipped:<file>"``).
"""

from __future__ import annotations

import json
import warnings
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from esi_guard.backends.base import states_engine
from esi_guard.backends.embedded import EMBEDDED_MODEL_ID
from esi_guard.exceptions import ConfigurationError, EngineMismatchWarning

if TYPE_CHECKING:
    from esi_guard.backends.base import Backend
    from esi_guard.policy import Granularity

__all__ = ["SHIPPED", "Shipped", "shipped", "shipped_for"]

SHIPPED = Path(__file__).parents[1] / "shipped"
"""The folder of the shipped threshold files."""


class Shipped(NamedTuple):
    """A shipped threshold file, as the registry reads it (its header only)."""

    path: Path
    model: str
    model_sha256: str
    engine: str | None
    probe: bool
    """It holds a hidden-state probe: it applies only on its engine's states."""
    esi_alone: bool
    """Its threshold is on ESI itself (no combined score, cascade or probe): for sentence guards."""

    @property
    def source(self) -> str:
        """What results report as their ``threshold_source``."""
        return f"shipped:{self.path.name}"


@cache
def shipped() -> tuple[Shipped, ...]:
    """Every shipped file, in name order."""
    found = []
    for path in sorted(SHIPPED.glob("*.json")):
        raw = json.loads(path.read_text(encoding="utf-8"))
        combined = raw.get("combined") or {}
        alone = not any(raw.get(key) for key in ("combined", "free_score", "esi_probe"))
        found.append(Shipped(path, raw["model"], raw["model_sha256"], raw.get("engine"),
                             combined.get("hidden") is not None, alone))  # fmt: skip
    return tuple(found)


def shipped_for(backend: Backend | None, granularity: Granularity = "answer") -> Shipped:
    """The shipped file ``backend``'s guard decides with (None: the embedded model's).

    An answer guard takes the model's combined-score file where one ships, a sentence guard
    (``granularity="sentence"``) its ESI-alone file. A hidden-state probe applies only on its
    engine's states: elsewhere the file without one is taken, with an
    :class:`~esi_guard.exceptions.EngineMismatchWarning`.

    Raises:
        ConfigurationError: No file ships for this model, only a probe fitted on another engine,
            or none on ESI alone for a sentence guard; the message says to calibrate.
    """
    files = shipped()
    if backend is None or backend.model_id == EMBEDDED_MODEL_ID:
        ours = [f for f in files if f.model == EMBEDDED_MODEL_ID]
    else:
        digest = backend.model_sha256
        ours = [f for f in files if digest is not None and f.model_sha256 == digest]
    if not ours:
        names = ", ".join(sorted({f.path.stem for f in files}))
        msg = (
            f"ESIGuard needs threshold=... for {model_of(backend)!r}: the package ships a "
            f"calibrated one for its known models only ({names}; matched by the GGUF "
            "file's sha256). Calibrate it on your labelled questions with "
            "`esi-guard calibrate`, then ESIGuard.from_calibration(path)"
        )
        raise ConfigurationError(msg)
    engine = None if backend is None else states_engine(backend.engine)

    def applies(file: Shipped) -> bool:
        return not file.probe or engine is None or states_engine(file.engine or "") == engine

    if granularity == "sentence":
        ours = [f for f in ours if f.esi_alone]
        if not ours:
            msg = (
                f"the shipped calibration for {model_of(backend)!r} decides on p_wrong of a "
                "combined score, and a guard judging sentences (action='redact', "
                "decide_on='sentences', stream_mode='sentences') decides on each sentence's "
                "ESI: give threshold=... or calibrate one with `esi-guard calibrate --score esi`"
            )
            raise ConfigurationError(msg)
    fits = [f for f in ours if applies(f)]
    if not fits:
        msg = (
            f"the shipped calibration for {ours[0].model!r} holds a hidden-state probe "
            f"fitted on the {ours[0].engine} engine and this backend is {engine}: calibrate "
            "on this engine with `esi-guard calibrate`, or give threshold=..."
        )
        raise ConfigurationError(msg)
    runs = None if backend is None else backend.engine
    chosen = max(
        fits, key=lambda f: (not f.esi_alone, f.probe, runs is not None and f.engine == runs)
    )
    skipped = [f for f in ours if f.probe and f not in fits]
    if skipped and not chosen.probe:
        msg = (
            f"{skipped[0].source} holds a hidden-state probe fitted on the {skipped[0].engine} "
            f"engine, and this guard runs {engine}: it decides with {chosen.source} "
            "instead (no probe; measured in docs/calibration.md)"
        )
        warnings.warn(msg, EngineMismatchWarning, stacklevel=4)
    return chosen


def model_of(backend: Backend | None) -> str:
    """The model as messages name it."""
    return EMBEDDED_MODEL_ID if backend is None else backend.model_id
