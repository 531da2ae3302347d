"""The Ray that esi-guard runs on: a cluster it joins, or a local one it starts on loopback.

``esi-guard serve --ray`` and ``calibrate``/``evaluate --workers`` call :func:`connect`.
Given an address (``--ray-address``, else ``RAY_ADDRESS``) they join that cluster and
start nothing. Without one (or with ``local``) they start a Ray only this machine reaches:

* every Ray process listens on loopback: the GCS, the raylet and its object manager, the
  dashboard agent and its metrics export, the runtime-env agent, the autoscaler monitor,
  each worker's gRPC server. Ray on Linux turns a loopback node address
  (``ray.init(_node_ip_address="127.0.0.1")``) into the machine's own and then listens on
  all interfaces; only its local-only switch, ``ENABLE_RAY_CLUSTER`` off (what Ray does on
  macOS and Windows, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), keeps the node on
  127.0.0.1. It is set for the start alone, and the node's address checked after;
* the dashboard is off (its job API runs any code it is sent);
* Ray's token authentication stays as Ray sets it (on by default for a local Ray, 2.60).

One socket Ray offers no way to move: each Ray Serve replica's inter-deployment gRPC
server, which Ray Serve (2.60) binds to ``[::]:0`` (behind Ray's token authentication);
docs/ray.md says so and how to firewall it.

Colours: the lines Ray relays from its processes (``(ProxyActor pid=...)``) carry ANSI
colour codes; where stderr is not a terminal (a log file), they are left out
(``RAY_COLOR_PREFIX=0``, unless already set).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from esi_guard._imports import import_extra
from esi_guard.exceptions import ConfigurationError

ray = import_extra("ray", needed_by="esi_guard.ray", what="Ray", extra="ray")

__all__ = ["LOCAL", "Connected", "connect", "is_loopback"]

LOCAL = "local"
"""The address that asks for a local Ray started here (as ``ray.init`` reads it)."""

Connected = Literal["already", "joined", "started"]
"""How :func:`connect` found Ray: initialised before, a cluster joined, a local one started."""


def connect(address: str | None = None, **options: Any) -> Connected:
    """Join the Ray cluster at ``address``, or start a local Ray on loopback (see the module).

    Args:
        address: A running cluster (``auto``, ``host:6379``, ``ray://host:10001``); None:
            ``RAY_ADDRESS``; neither, or ``"local"``: a local Ray started here.
        **options: More of ``ray.init``'s arguments for a local Ray (``num_cpus``...).

    Returns:
        ``"already"`` when Ray was initialised in this process before (nothing done), else
        ``"joined"`` or ``"started"``: the caller ends either with ``ray.shutdown()``
        (which stops a Ray started here, Serve and all, and only leaves a joined one).

    Raises:
        ConfigurationError: the local Ray's node is not on loopback (a Ray without the
            local-only switch); it is stopped again.
    """
    if ray.is_initialized():
        return "already"
    if not sys.stderr.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    address = address or os.environ.get("RAY_ADDRESS") or LOCAL
    if address != LOCAL:
        ray.init(address=address, logging_level=logging.WARNING)
        return "joined"
    with _local_only():
        ray.init(address=LOCAL, include_dashboard=False, logging_level=logging.WARNING,
                 **options)  # fmt: skip
    node = ray.util.get_node_ip_address()
    if not is_loopback(node):
        ray.shutdown()
        msg = (f"the local Ray started on {node}, not on loopback: this Ray ({ray.__version__}) "
               "has no local-only switch; start Ray yourself on a private network and pass "
               "its address (--ray-address)")  # fmt: skip
        raise ConfigurationError(msg)
    return "started"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address: ``127.x``, ``::1``, ``::ffff:127.x``, localhost."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


@contextmanager
def _local_only() -> Iterator[None]:
    """Ray's local-only switch on for the block: a node started in it is on loopback.

    ``ray._private.ray_constants.ENABLE_RAY_CLUSTER`` is read when Ray picks the node's
    address (``services.get_node_ip_address``); the processes it starts get that address
    on their command lines, so none of them, nor a later ``ray.init``, needs the switch.
    A Ray without it starts as it would; :func:`connect` checks the address it got.
    """
    constants = import_extra("ray._private.ray_constants", needed_by="esi_guard.ray",
                             what="Ray", extra="ray")  # fmt: skip
    before = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if before is None:
            del constants.ENABLE_RAY_CLUSTER
        else:
            constants.ENABLE_RAY_CLUSTER = before
