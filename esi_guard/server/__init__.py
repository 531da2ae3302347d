"""``esi-guard serve``: the guard as an OpenAI-compatible chat-completions server.

Needs the ``serve`` extra (FastAPI, uvicorn, prometheus-client). ``create_app(guard,
settings)`` is the ASGI app; the ``esi-guard serve`` command (:mod:`esi_guard.cli.serve`)
builds the guard from its flags and runs the app with uvicorn. The parts, each a private
module:

* ``_schema``   the wire format: OpenAI's request (unknown fields refused), responses, chunks
* ``_errors``   OpenAI-shaped errors, each failure recognised by its type
* ``_batcher``  the micro-batcher: concurrent requests in one batched guard call
* ``_service``  the guards, the batcher and the answers, apart from HTTP (``Served``: what
                the routes ask of it, in process or on Ray: :mod:`esi_guard.ray`)
* ``_stream``   server-sent events: chunks and the scored ending
* ``_metrics``  Prometheus metrics; ``_timed`` times the backend's steps for them
* ``app``       the routes, streams, key check and body limit

docs/serve.md says how to run it, call it and scale it.
"""

from esi_guard.server._batcher import MicroBatcher
from esi_guard.server._schema import ABSTAIN_FINISH_REASON, ChatRequest
from esi_guard.server._settings import ServeSettings
from esi_guard.server.app import create_app, run

__all__ = [
    "ABSTAIN_FINISH_REASON",
    "ChatRequest",
    "MicroBatcher",
    "ServeSettings",
    "create_app",
    "run",
]
