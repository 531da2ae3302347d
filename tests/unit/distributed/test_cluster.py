"""Which Ray esi-guard starts or joins, without starting one: ``ray.init`` faked.

The real start, and what then listens where, is ``tests/integration/test_ray_loopback.py``.
"""

from __future__ import annotations

import io
import os
import sys
from typing import Any

import pytest

pytest.importorskip("ray")

from ray._private import ray_constants

from esi_guard.exceptions import ConfigurationError
from esi_guard.ray import _cluster
from esi_guard.ray._cluster import connect, is_loopback


class _Ray:
    """``ray.init`` and friends, recording each call and the local-only switch during it."""

    __version__ = "2.60.0"

    def __init__(self, node: str = "127.0.0.1", initialized: bool = False) -> None:
        self.node, self.initialized = node, initialized
        self.inits: list[dict[str, Any]] = []
        self.shutdowns = 0
        self.util = self

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **kwargs: Any) -> None:
        self.inits.append({**kwargs, "cluster switch": ray_constants.ENABLE_RAY_CLUSTER})

    def get_node_ip_address(self) -> str:
        return self.node

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> _Ray:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_COLOR_PREFIX", "")  # connect sets it: restored after the test
    monkeypatch.delenv("RAY_COLOR_PREFIX")
    fake = _Ray()
    monkeypatch.setattr(_cluster, "ray", fake)
    return fake


@pytest.mark.parametrize("address", [None, "local"])
def test_no_address_starts_a_local_ray_on_loopback_its_dashboard_off(
    fake_ray: _Ray, address: str | None
) -> None:
    switch = ray_constants.ENABLE_RAY_CLUSTER
    assert connect(address, num_cpus=2) == "started"
    (init,) = fake_ray.inits
    assert init["address"] == "local" and init["include_dashboard"] is False
    assert init["num_cpus"] == 2
    assert init["cluster switch"] is False  # the node's address is picked on loopback
    assert ray_constants.ENABLE_RAY_CLUSTER is switch  # and the switch put back


@pytest.mark.parametrize("given", ["--ray-address", "RAY_ADDRESS"])
def test_an_address_joins_that_cluster_and_starts_nothing(
    fake_ray: _Ray, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    if given == "RAY_ADDRESS":
        monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert connect("ray://head:10001" if given != "RAY_ADDRESS" else None) == "joined"
    (init,) = fake_ray.inits
    assert init["address"] == "ray://head:10001"
    assert "include_dashboard" not in init
    assert init["cluster switch"] is ray_constants.ENABLE_RAY_CLUSTER  # untouched


def test_a_local_ray_that_is_not_on_loopback_is_stopped_and_refused(
    fake_ray: _Ray,
) -> None:
    fake_ray.node = "192.0.2.2"
    with pytest.raises(ConfigurationError, match=r"started on 192\.0\.2\.2, not on loopback"):
        connect(None)
    assert fake_ray.shutdowns == 1


@pytest.mark.parametrize("mine", [None, "1"])
def test_ray_s_relayed_lines_are_not_coloured_into_a_file(
    fake_ray: _Ray, monkeypatch: pytest.MonkeyPatch, mine: str | None
) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file, not a terminal
    if mine is not None:
        monkeypatch.setenv("RAY_COLOR_PREFIX", mine)
    connect(None)
    assert os.environ["RAY_COLOR_PREFIX"] == (mine or "0")  # the user's own choice kept


def test_a_ray_initialised_before_is_left_alone(fake_ray: _Ray) -> None:
    fake_ray.initialized = True
    assert connect("ray://head:10001") == "already"
    assert fake_ray.inits == []


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("192.0.2.2", False),
    ("::ffff:192.0.2.2", False), ("node-1", False),
])  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
