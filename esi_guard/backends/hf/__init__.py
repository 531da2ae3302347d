"""Transformers in process: :class:`HFBackend` (``backend.py``) over its engine (``_engine.py``).

Teacher forcing and streaming are in ``_force.py`` and ``_stream.py``. Importing this package
imports neither torch nor transformers.
"""

from esi_guard.backends.hf.backend import HFBackend

__all__ = ["HFBackend"]
