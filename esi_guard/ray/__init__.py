"""The guard past one machine, on Ray (the ``ray`` extra: ``pip install 'esi-guard[ray]'``).

:func:`guard_app` (or ``app_builder``, from a Serve config) is the guard as a Ray Serve application,
one guard per replica; :func:`run_on_ray` is ``esi-guard serve --ray``; :class:`ScoringPool`
spreads ``esi-guard calibrate/evaluate --workers N`` over Ray actors. docs/ray.md shows each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from esi_guard.ray.scoring import ScoringPool
    from esi_guard.ray.serving import GuardAppArgs, app_builder, guard_app, run_on_ray

__all__ = ["GuardAppArgs", "ScoringPool", "app_builder", "guard_app", "run_on_ray"]

_WHERE = {
    "GuardAppArgs": "esi_guard.ray.serving",
    "app_builder": "esi_guard.ray.serving",
    "guard_app": "esi_guard.ray.serving",
    "run_on_ray": "esi_guard.ray.serving",
    "ScoringPool": "esi_guard.ray.scoring",
}


def __getattr__(name: str) -> Any:
    """Ray is imported when a name is first used."""
    if name not in _WHERE:
        msg = f"module 'esi_guard.ray' has no attribute {name!r}"
        raise AttributeError(msg)
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
