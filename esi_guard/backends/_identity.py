"""Which weights a backend runs: a GGUF file's digest, and the embedded model's one name.

The same file loaded any way is one model to a threshold file: its sha256 (cached per process by
path, size and mtime; a 5 GB file takes seconds) says so, and the embedded file has one
``model_id``, :data:`~esi_guard.backends.embedded.EMBEDDED_MODEL_ID`.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from esi_guard.backends._embedded_files import EMBEDDED_MODEL_ID, embedded_gguf
from esi_guard.exceptions import ModelLoadError

__all__ = [
    "cache_dir",
    "check_model_path",
    "embedded_gguf_in",
    "file_sha256",
    "gguf_model_id",
    "names_a_path",
]

_DIGESTS: dict[tuple[str, int, int], str] = {}
_LOCK = threading.Lock()
_CHUNK = 1 << 20


def cache_dir() -> Path:
    """``$ESI_GUARD_CACHE``, else ``$XDG_CACHE_HOME/esi_guard``, else ``~/.cache/esi_guard``."""
    own = os.environ.get("ESI_GUARD_CACHE")
    if own:
        return Path(own).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "esi_guard"


def file_sha256(path: str | Path) -> str | None:
    """The file's sha256 (hex), computed once per process and version; None: unreadable."""
    real = os.path.realpath(path)
    try:
        stat = os.stat(real)
    except OSError:
        return None
    key = (real, stat.st_size, stat.st_mtime_ns)
    with _LOCK:  # one thread hashes a file while the others asking for it wait
        if key not in _DIGESTS:
            digest = hashlib.sha256()
            try:
                with open(real, "rb") as handle:
                    while chunk := handle.read(_CHUNK):
                        digest.update(chunk)
            except OSError:
                return None
            _DIGESTS[key] = digest.hexdigest()
        return _DIGESTS[key]


def _embedded_file() -> str | None:
    try:
        return os.path.realpath(embedded_gguf())
    except ModelLoadError:
        return None


def gguf_model_id(path: str | Path, default: str) -> str:
    """``EMBEDDED_MODEL_ID`` when ``path`` is the embedded file or a copy; else ``default``."""
    embedded = _embedded_file()
    if embedded is None:
        return default
    real = os.path.realpath(path)
    if real == embedded:
        return EMBEDDED_MODEL_ID
    try:
        same_size = os.path.getsize(real) == os.path.getsize(embedded)
    except OSError:
        return default
    digest = file_sha256(real) if same_size else None
    return EMBEDDED_MODEL_ID if digest and digest == file_sha256(embedded) else default


def embedded_gguf_in(folder: str) -> Path | None:
    """The embedded GGUF when ``folder`` is the one it ships in (transformers loaded it there)."""
    if not folder or not os.path.isdir(folder):
        return None
    embedded = _embedded_file()
    if embedded is None or os.path.realpath(folder) != os.path.dirname(embedded):
        return None
    return Path(embedded)


def names_a_path(model: str) -> bool:
    """Whether ``model`` is a path (``.gguf``, or starts ``/ ./ ../ ~``), never a hub id."""
    return model.endswith(".gguf") or model.startswith(("/", "./", "../", "~"))


def check_model_path(model: str) -> None:
    """A :class:`ModelLoadError` when a path-like ``model`` is missing (before any hub lookup)."""
    if names_a_path(model) and not Path(model).expanduser().exists():
        msg = f"model file not found: {model}"
        raise ModelLoadError(msg)
