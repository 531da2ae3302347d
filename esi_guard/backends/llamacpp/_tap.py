"""Hidden states out of a ``llama_decode`` through llama.cpp's eval callback (``cb_eval``).

The callback tells llama.cpp which graph tensors it wants and copies each out once computed: no
second pass and no ``embeddings`` context (every token an output). Names: ``l_out-L``, block
``L``'s output (transformers' ``hidden_states[L + 1]``), every token (the last block: outputs
only); ``result_norm``, the final norm's output (outputs only). The C side holds only a pointer to
the ctypes callback: keep the :class:`Tap` alive as long as the context.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esi_guard.backends.hidden import FINAL
from esi_guard.exceptions import BackendError, ConfigurationError

__all__ = ["Tap", "tensor_name"]


def tensor_name(layer: int) -> str:
    """The graph name of a layer's output (``FINAL``: the final norm's) in llama.cpp."""
    return "result_norm" if layer == FINAL else f"l_out-{layer}"


def _ggml(llama_cpp: Any) -> Any:
    """The ggml base library, loaded from beside llama-cpp-python's own."""
    folder = Path(llama_cpp.__file__).parent / "lib"
    found = sorted(folder.glob("libggml-base.*")) + sorted(folder.glob("ggml-base.*"))
    if not found:
        msg = (
            f"hidden states from llama.cpp need ggml's base library, not found in {folder} "
            "(a llama-cpp-python build without separate ggml libraries?)"
        )
        raise ConfigurationError(msg)
    lib = ctypes.CDLL(str(found[0]))
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    lib.ggml_nelements.restype = ctypes.c_int64
    lib.ggml_nelements.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_backend_tensor_get.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
    ]  # fmt: skip
    return lib


class Tap:
    """Copies the wanted tensors of each decode; asks for nothing while disarmed.

    Args:
        llama_cpp: The ``llama_cpp`` module.
        width: The model's hidden size (each tensor's row length).
    """

    def __init__(self, llama_cpp: Any, width: int) -> None:
        self._lib = _ggml(llama_cpp)
        self.width = width
        self._wanted: frozenset[bytes] = frozenset()
        self._got: dict[str, list[np.ndarray]] = {}
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._call)

    def arm(self, names: Iterable[str]) -> None:
        """Read these tensors in the coming decode (and forget what the last one read)."""
        self._wanted = frozenset(name.encode() for name in names)
        self._got = {}

    def disarm(self) -> None:
        """Read nothing."""
        self._wanted = frozenset()
        self._got = {}

    def _call(self, tensor: int, ask: bool, _user: Any) -> bool:
        if not self._wanted:
            return not ask  # asked: no; computed (never, unasked): go on
        name = self._lib.ggml_get_name(tensor)
        if ask:
            return name in self._wanted
        if name in self._wanted:
            count, size = self._lib.ggml_nelements(tensor), self._lib.ggml_nbytes(tensor)
            if size != 4 * count or count % self.width:  # not a float32 (tokens, width)
                return True  # left out: ``take`` reports it missing
            out = np.empty(count, dtype=np.float32)
            self._lib.ggml_backend_tensor_get(tensor, out.ctypes.data, 0, size)
            self._got.setdefault(name.decode(), []).append(out.reshape(-1, self.width))
        return True

    def take(self, tokens: int, outputs: Sequence[int]) -> dict[str, np.ndarray]:
        """Each armed tensor's rows at ``outputs`` (batch indices), ``(len(outputs), width)``.

        Raises:
            BackendError: A wanted tensor is missing (not in this graph) or has a wrong row count.
        """
        got = {name: np.concatenate(pieces) for name, pieces in self._got.items()}
        out = {}
        for raw in self._wanted:
            name = raw.decode()
            rows = got.get(name)
            if rows is None:
                msg = f"llama.cpp computed no tensor {name!r} in this decode"
                raise BackendError(msg)
            if len(rows) == tokens:
                out[name] = rows[list(outputs)]
            elif len(rows) == len(outputs):
                out[name] = rows
            else:
                msg = (
                    f"tensor {name!r} has {len(rows)} rows for a decode of {tokens} tokens "
                    f"and {len(outputs)} outputs"
                )
                raise BackendError(msg)
        self._got = {}
        return out
