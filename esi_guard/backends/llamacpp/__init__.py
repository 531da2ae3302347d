"""llama.cpp in process: ESI on a GGUF file through llama-cpp-python, fast on CPUs.

White-box like :class:`~esi_guard.HFBackend`: the values are the model's raw logits, top-k kept per
answer position, decoded on a context of the backend's own (``_engine.py``: the weights are shared,
the ``Llama``'s own context is never touched). ``pack_rows`` decodes a request's rows together
after their shared prefix (:mod:`._pack`): llama.cpp's CPU kernels round with a decode's size, so
packed rows differ from rows alone (by up to about two logits) but never depend on other requests;
``pack_rows=False``: generation and forcing of a short prompt agree to the bit.
``forcing_precision``: a small quantized model on the CPU forces on a float16 copy of its weights
(:mod:`._copy`; engine ``llamacpp-f16``). Importing this does not import llama-cpp-python.
"""

from esi_guard.backends.llamacpp._loading import load_llama
from esi_guard.backends.llamacpp.backend import COMPLETION_TEMPLATE, LlamaCppBackend

__all__ = ["COMPLETION_TEMPLATE", "LlamaCppBackend", "load_llama"]
