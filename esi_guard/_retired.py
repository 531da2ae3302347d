"""What was retired, in which release, and what replaces it: one table, one error.

A retired mode's setting, file field or CLI option gets a one-line
:class:`~esi_guard.exceptions.ConfigurationError` naming the release and what to use instead; a
file that carries such a field unset (``null``, as older files do) reads as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from esi_guard.exceptions import ConfigurationError

__all__ = ["RELEASE", "RETIRED", "check", "retired"]

RELEASE = "0.2.0"
"""The release that retired the modes below."""

_SEQUENTIAL = (
    "sequential ESI (min_variants, stop_constant, calibrate --min-variants) was retired in "
    f"esi-guard {RELEASE}: it needed 5.2-5.6 of 10 variants for 0.98-0.99 agreement and cost "
    "2.8-3.6x a plain answer (docs/results.md); use the value cascade instead "
    "(esi-guard calibrate --score combined --cascade), about 1.02x a plain answer"
)
_CONTEXT = (
    "decide_on='context_reliance' (and with_prompt's context_key) was retired in "
    f"esi-guard {RELEASE}: on SQuAD 2.0 its AUROC was 0.404, below chance, for one more "
    "forced row per answer (docs/results.md); decide on ESI (decide_on='esi') or on a "
    "calibrated combined score (esi-guard calibrate --score combined)"
)
_PROBE_ON_COMBINED = (
    "the ESI-probe cascade on a combined score (esi_probe with combined) was retired in "
    f"esi-guard {RELEASE}: it needs labels, as the value cascade does, which needs no "
    "distilled probe and met its goals at 1.02x a plain answer (docs/results.md); use "
    "esi-guard calibrate --score combined --cascade, or esi_probe with a guard deciding on ESI"
)

RETIRED: dict[str, str] = {
    "min_variants": _SEQUENTIAL,
    "stop_constant": _SEQUENTIAL,
    "sequential": _SEQUENTIAL,
    "context_key": _CONTEXT,
    "context_reliance": _CONTEXT,
    "esi_probe_on_combined": _PROBE_ON_COMBINED,
}
"""Each retired setting, file field or value, and the one line that says so."""


def retired(name: str, where: str = "") -> ConfigurationError:
    """The error for the retired ``name`` (a key of :data:`RETIRED`), prefixed by ``where``."""
    prefix = f"{where}: " if where else ""
    return ConfigurationError(prefix + RETIRED[name])


def check(values: Mapping[str, Any], names: tuple[str, ...], where: str = "") -> dict[str, Any]:
    """``values`` less its unset (absent or None) retired ``names``; an error for a set one."""
    for name in names:
        if values.get(name) is not None:
            raise retired(name, where)
    return {key: value for key, value in values.items() if key not in names}
