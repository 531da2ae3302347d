"""The guard past one machine, on Ray (the ``ray`` extra: ``pip install 'esi-guard[ray]'``).

* :func:`guard_app`: the guard as a Ray Serve application: ``esi-guard serve``'s
  OpenAI-compatible endpoint in front, one guard per replica behind it, each replica
  micro-batching its requests; a replica that dies turns its requests in flight into a
  retryable OpenAI-shaped 503 (``replica_unavailable``) and Ray starts another.
  ``app_builder`` builds the same from a Serve config's ``args`` (``serve run``, KubeRay).
* :func:`run_on_ray`: ``esi-guard serve --ray``: start (or join) Ray, serve, wait.
* :class:`ScoringPool`: ``esi-guard calibrate/evaluate --workers N``: a run's batches
  spread over Ray actors, one guard each.

docs/ray.md ("Past one machine") shows each, with the measured figures.
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
