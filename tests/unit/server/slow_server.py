"""A server whose answers take ``--seconds``, run as the CLI runs it (for the drain test).

python -m tests.unit.server.slow_server --port 8123 --seconds 1.5 --drain-seconds 10
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from esi_guard import ESIGuard, FakeBackend
from esi_guard.server import ServeSettings, create_app, run


class SlowBackend(FakeBackend):
    def __init__(self, seconds: float) -> None:
        super().__init__({"What is the capital of France?": "Paris"})
        self.seconds = seconds

    def generate(self, prompts: Any, **kwargs: Any) -> Any:
        time.sleep(self.seconds)
        return super().generate(prompts, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--drain-seconds", type=int, default=10)
    args = parser.parse_args()
    guard = ESIGuard(backend=SlowBackend(args.seconds), threshold=0.3, n_variants=2)
    app = create_app(guard, ServeSettings(warm_up=False))
    run(app, port=args.port, drain_seconds=args.drain_seconds)


if __name__ == "__main__":
    main()
