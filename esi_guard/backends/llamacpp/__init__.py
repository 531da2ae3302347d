"""llama.cpp in process: :class:`LlamaCppBackend` and the llama.cpp context it runs on.

``backend.py`` is the backend (templates, greedy answers, teacher forcing, sampling);
``_engine.py`` is the context of its own, the batch it decodes and the top-k of logits;
``_pack.py`` puts a request's forced rows into few decodes.
Importing this package does not import llama-cpp-python.
"""

from esi_guard.backends.llamacpp.backend import COMPLETION_TEMPLATE, LlamaCppBackend

__all__ = ["COMPLETION_TEMPLATE", "LlamaCppBackend"]
