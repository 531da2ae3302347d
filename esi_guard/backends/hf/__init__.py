"""Transformers in process: :class:`HFBackend` and the engine it runs on.

``backend.py`` is the backend (batching, loading, identity); ``_engine.py`` holds the loaded
model and tokenizer with what every call on them needs; ``_force.py`` and ``_stream.py``
are teacher forcing and live streaming on that engine. Importing
this package imports neither torch nor transformers.
"""

from esi_guard.backends.hf.backend import HFBackend

__all__ = ["HFBackend"]
