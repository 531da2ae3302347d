"""A real llama.cpp OpenAI-compatible server (llama-cpp-python) with the embedded model.

Started with ``integrations.llamacpp.server.LlamaServer`` on a free loopback port, once per session,
and stopped at the end. Tests here mark themselves ``integration`` and ``server``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from integrations.llamacpp.server import LlamaServer

__all__ = ["LlamaServer"]


def start() -> LlamaServer:
    """One server thread each, so two servers share the two cores."""
    return LlamaServer.start(n_threads=1)


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    with start() as server:
        yield server


@pytest.fixture(scope="session")
def llama_server_2() -> Iterator[LlamaServer]:
    """A second server, so slow echo work can run on both cores."""
    with start() as server:
        yield server


@pytest.fixture
def fresh_server() -> Iterator[LlamaServer]:
    """A server of the test's own, for tests that kill it."""
    with start() as server:
        yield server
