"""The run's JSONL cache: its typed header, and reading, checking and rewriting the file.

The first line is the header (:class:`RunHeader`), each later one an example's record. A cache
scored otherwise (model, engine, scoring or data; not the request) is refused, not mixed in.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esi_guard.backends.hidden import HiddenSpec
from esi_guard.exceptions import ConfigurationError
from esi_guard.guard import ESIGuard
from esi_guard.result import ScoringConfig

__all__ = [
    "CACHE_KIND",
    "CACHE_VERSION",
    "Records",
    "RunHeader",
    "beside",
    "complete_cache",
    "default_cache",
    "donor_cache",
    "load",
    "open_cache",
    "write_labels",
]

CACHE_KIND = "esi-guard/calibration-cache"
CACHE_VERSION = 2
"""2: the header has ``version``, ``request``, ``engine`` and ``model_sha256``."""

Records = dict[int, dict[str, Any]]
"""A cache's records by example index."""


@dataclass(frozen=True)
class RunHeader:
    """What identifies a run: a cache is only reused by a run with the same header.

    ``request`` is what the command asked for, known before any model loads; the rest is what a
    threshold file records of the model and scoring (:meth:`ThresholdFile.from_run`).
    """

    request: dict[str, Any]
    dataset_sha256: str
    model: str
    """The backend's ``model_id``."""
    engine: str | None
    model_sha256: str | None
    scoring: ScoringConfig
    """The full scoring configuration, the run's prompts included."""
    hidden_states: HiddenSpec | None = None
    """The states each record keeps (``hidden``), when the run keeps them."""

    @classmethod
    def of(
        cls,
        guard: ESIGuard,
        dataset_sha256: str,
        system_prompt: str | None,
        template: str | None = None,
        request: dict[str, Any] | None = None,
    ) -> RunHeader:
        """The header of a run scored by ``guard`` with these prompts."""
        scoring = guard.scoring_config.model_copy(
            update={"system_prompt": system_prompt, "prompt_template": template}
        )
        return cls(request=request or {}, dataset_sha256=dataset_sha256,
                   model=guard.backend.model_id, engine=guard.backend.engine,
                   model_sha256=guard.backend.model_sha256, scoring=scoring,
                   hidden_states=guard.hidden_states)  # fmt: skip

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunHeader:
        """The header of a cache's first line."""
        spec = raw.get("hidden_states")
        hidden = None if spec is None else HiddenSpec(tuple(spec["layers"]),
                                                       tuple(spec["positions"]))  # fmt: skip
        return cls(request=raw["request"], dataset_sha256=raw["dataset_sha256"],
                   model=raw["model"], engine=raw["engine"], model_sha256=raw["model_sha256"],
                   scoring=ScoringConfig(**raw["scoring"]), hidden_states=hidden)  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        """The cache's first line, its keys in the order every cache has them."""
        header = {
            "kind": CACHE_KIND,
            "version": CACHE_VERSION,
            "request": self.request,
            "dataset_sha256": self.dataset_sha256,
            "model": self.model,
            "engine": self.engine,
            "model_sha256": self.model_sha256,
            "scoring": self.scoring.model_dump(),
        }
        if self.hidden_states is not None:
            spec = self.hidden_states
            header["hidden_states"] = {"layers": list(spec.layers),
                                       "positions": list(spec.positions)}  # fmt: skip
        return header


_SCORED_REQUEST = ("chat_template", "dtype")
"""Request keys that change the answers and scores, and nothing else in the header records."""


def _identity(header: dict[str, Any]) -> dict[str, Any]:
    """What the scores depend on: the header, its request cut to ``_SCORED_REQUEST``'s keys."""
    request = header.get("request") or {}
    same = {key: value for key, value in header.items() if key != "request"}
    return {**same, "request": {key: request.get(key) for key in _SCORED_REQUEST}}


def default_cache(data: Sequence[Path], request: dict[str, Any], digest: str) -> Path:
    """In the working directory, never beside the (shared) data; named by what is asked."""
    key = json.dumps({"request": request, "dataset_sha256": digest}, sort_keys=True)
    stem = "+".join(path.stem for path in data)
    return Path(f"esi-cache-{stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.jsonl")


def beside(cache: Path) -> Path:
    """Where a run keeping hidden states writes when ``--cache`` holds the run without."""
    return cache.with_name(f"{cache.stem}-hidden{cache.suffix}")


def load(path: Path) -> tuple[dict[str, Any], Records] | None:
    """A cache's header (as written) and records by index; None when there is no cache yet."""
    if path.is_dir():
        msg = f"--cache {path} is a folder: give a file (JSONL) path"
        raise ConfigurationError(msg)
    if not path.exists() or path.stat().st_size == 0:
        return None
    with path.open(encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    try:
        first = json.loads(lines[0])
    except (json.JSONDecodeError, IndexError) as exc:
        msg = f"{path} is not a calibration cache"
        raise ConfigurationError(msg) from exc
    if not isinstance(first, dict) or first.get("kind") != CACHE_KIND:
        msg = f"{path} is not a calibration cache"
        raise ConfigurationError(msg)
    if first.get("version") != CACHE_VERSION:
        msg = (
            f"the cache {path} was written by an older esi-guard (its header has no engine "
            "or request); delete it or use another --cache path"
        )
        raise ConfigurationError(msg)
    done: Records = {}
    for line in lines[1:]:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill: that example is scored again
        done[int(record["index"])] = record
    return first, done


def open_cache(path: Path, header: RunHeader) -> Records:
    """The records already in ``path`` for this run; a new cache gets the header line."""
    found = load(path)
    if found is None:
        path.write_text(json.dumps(header.as_json()) + "\n", encoding="utf-8")
        return {}
    first, done = found
    if _identity(first) != _identity(header.as_json()):
        msg = (
            f"the cache {path} belongs to another run (model, scoring or data differ); "
            "use another --cache path or delete it"
        )
        raise ConfigurationError(msg)
    return done


def complete_cache(
    path: Path, request: dict[str, Any], dataset_sha256: str, n: int
) -> tuple[RunHeader, list[dict[str, Any]]] | None:
    """The header and ``n`` records of a finished cache for this request and data, else None."""
    found = load(path)
    if found is None:
        return None
    header, done = found
    if header.get("request") != request or header.get("dataset_sha256") != dataset_sha256:
        return None
    if any(i not in done for i in range(n)):
        return None
    return RunHeader.from_json(header), [done[i] for i in range(n)]


def donor_cache(paths: Sequence[Path], header: RunHeader) -> tuple[Path, Records] | None:
    """A cache of ``header``'s run without hidden states (the first of ``paths``), or None."""
    wanted = {k: v for k, v in _identity(header.as_json()).items() if k != "hidden_states"}
    for path in paths:
        found = load(path) if path.exists() else None
        if found is not None and _identity(found[0]) == wanted:
            return path, found[1]
    return None


def write_labels(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Rewrite the cache's records (``labels`` included) atomically, its header unchanged."""
    with path.open(encoding="utf-8") as handle:
        header = handle.readline()
    partial = path.with_suffix(".partial" + path.suffix)  # esi-cache-*.jsonl: ignored too
    with partial.open("w", encoding="utf-8") as out:
        out.write(header if header.endswith("\n") else header + "\n")
        for record in records:
            out.write(json.dumps(record) + "\n")
    os.replace(partial, path)
