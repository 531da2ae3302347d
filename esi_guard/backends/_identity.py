"""Which weights a backend runs: a GGUF file's digest, and the embedded model's one name.

The same file loaded three ways (``LlamaCppBackend.default()``, a ``llama_cpp.Llama``
over its path, transformers from the ``.gguf``) is one model to a threshold file: the
digest (sha256 of the file's bytes) says so whatever the path, and the embedded file gets
one ``model_id``, :data:`~esi_guard.backends.embedded.EMBEDDED_MODEL_ID`, however it was
reached.

A digest is computed on first use and kept for the process, keyed by the file's real
path, size and modification time (a file replaced in place is hashed again). Hashing
reads the whole file: the embedded 98 MB one takes 0.08 s from the page cache (1.2 GB/s
on this project's machine), a 5 GB one a few seconds, once per process.
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
    """``EMBEDDED_MODEL_ID`` when ``path`` holds the embedded model's file, else ``default``.

    The same file (real path), or a copy of it: same size and digest, hashed only when
    the sizes match, so another model's file costs two ``stat`` calls.
    """
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
    """Whether ``model`` is a path, never a hub id.

    It is when it ends in ``.gguf`` or starts with ``/``, ``./``, ``../`` or ``~``.
    """
    return model.endswith(".gguf") or model.startswith(("/", "./", "../", "~"))


def check_model_path(model: str) -> None:
    """A :class:`ModelLoadError` when ``model`` names a local file or folder that is not there.

    A name that :func:`names_a_path` is a path, never a hub id: without this check a typo
    in it would surface as a model hub lookup failing (or a connection error offline).
    """
    if names_a_path(model) and not Path(model).expanduser().exists():
        msg = f"model file not found: {model}"
        raise ModelLoadError(msg)
