"""llama.cpp in process: :class:`LlamaCppBackend` and the llama.cpp context it runs on.

``backend.py`` is the backend (greedy answers, teacher forcing, sampling); ``_chat.py``
picks its chat template; ``_decoding.py`` runs the token-by-token loops; ``_engine.py``
is the context of its own, the batch it decodes and the top-k of logits; ``_pack.py``
puts a request's forced rows into few decodes; ``_copy.py`` makes the float16 (or
float32) copy forcing runs on; ``_tap.py`` reads hidden states; ``_loading.py`` loads a
``Llama`` safe to decode on this CPU (:func:`load_llama`; ``_cpu.py`` reads the CPU and
what llama.cpp was built for).
Importing this package does not import llama-cpp-python.
"""

from esi_guard.backends.llamacpp._loading import load_llama
from esi_guard.backends.llamacpp.backend import COMPLETION_TEMPLATE, LlamaCppBackend

__all__ = ["COMPLETION_TEMPLATE", "LlamaCppBackend", "load_llama"]
