"""``esi-guard serve``: the guard as an OpenAI-compatible chat-completions server.

Needs the ``serve`` extra. ``create_app`` is the ASGI app, :mod:`esi_guard.cli.serve` runs it; the
private modules split wire format, errors, batching, service, streams and metrics from the routes
(``app``). docs/serve.md says how to run, call and scale it.
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
