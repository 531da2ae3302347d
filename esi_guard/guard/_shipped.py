"""The calibrations shipped with the package: a known model's threshold file, found by digest.

``ESIGuard()`` and ``ESIGuard(llm=...)`` with no ``threshold`` decide with the threshold
file shipped for their model, when the package has one: the files in ``esi_guard/shipped/``,
each written by ``esi-guard calibrate`` (docs/calibration.md gives every command and what
each file measured on questions it was not fitted on). A file is the backend's when its
``model_sha256`` is the digest of the GGUF file the backend runs (the embedded model's
file is known by its ``model_id`` too, without hashing it).

A file holding a hidden-state probe applies only on the engine its states came from
(llama.cpp's and transformers' states of the same weights differ); on another engine the
guard takes the model's shipped file without one, says so in an
:class:`~esi_guard.exceptions.EngineMismatchWarning`, and every result's
``threshold_source`` names the file it took (``"shipped:<file>"``).
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
        found.append(Shipped(path, raw["model"], raw["model_sha256"], raw.get("engine"),
                             combined.get("hidden") is not None))  # fmt: skip
    return tuple(found)


def shipped_for(backend: Backend | None) -> Shipped:
    """The shipped file ``backend``'s guard decides with (None: the embedded model's).

    Raises:
        ConfigurationError: none ships for this model, or only a probe fitted on another
            engine: the message says to calibrate (and which models ship one).
    """
    files = shipped()
    if backend is None or backend.model_id == EMBEDDED_MODEL_ID:
        ours = [f for f in files if f.model == EMBEDDED_MODEL_ID]
    else:
        digest = backend.model_sha256
        ours = [f for f in files if digest is not None and f.model_sha256 == digest]
    if not ours:
        names = ", ".join(sorted({f.path.stem for f in files}))
        model = EMBEDDED_MODEL_ID if backend is None else backend.model_id
        msg = (
            f"ESIGuard needs threshold=... for {model!r}: the package ships a calibrated one "
            f"for its known models only ({names}; matched by the GGUF file's sha256). "
            "Calibrate it on your labelled questions with `esi-guard calibrate`, then "
            "ESIGuard.from_calibration(path)"
        )
        raise ConfigurationError(msg)
    engine = None if backend is None else states_engine(backend.engine)

    def applies(file: Shipped) -> bool:
        return not file.probe or engine is None or states_engine(file.engine or "") == engine

    fits = [f for f in ours if applies(f)]
    if not fits:
        msg = (
            f"the shipped calibration for {ours[0].model!r} holds a hidden-state probe "
            f"fitted on the {ours[0].engine} engine and this backend is {engine}: calibrate "
            "on this engine with `esi-guard calibrate`, or give threshold=..."
        )
        raise ConfigurationError(msg)
    chosen = max(fits, key=lambda f: (f.probe, backend is not None and f.engine == backend.engine))
    skipped = [f for f in ours if f.probe and f not in fits]
    if skipped and not chosen.probe:
        msg = (
            f"{skipped[0].source} holds a hidden-state probe fitted on the {skipped[0].engine} "
            f"engine, and this guard runs {engine}: it decides with {chosen.source} "
            "instead (no probe; measured in docs/calibration.md)"
        )
        warnings.warn(msg, EngineMismatchWarning, stacklevel=4)
    return chosen
