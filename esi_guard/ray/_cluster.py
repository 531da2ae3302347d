"""The Ray that esi-guard runs on: a cluster it joins, or a local one it starts on loopback.

:func:`connect` joins the cluster at ``--ray-address`` or ``RAY_ADDRESS``, starting nothing; else
it starts a Ray only this machine reaches: every process on loopback (Ray's local-only switch,
``ENABLE_RAY_CLUSTER`` off for the start, as Ray on Linux would listen on all interfaces; the
node's address checked after), the dashboard off (its job API runs any code it is sent), token
authentication as Ray sets it. One socket Ray cannot move: each Serve replica's gRPC server binds
``[::]:0``, behind that authentication (docs/ray.md says how to firewall it). Off a terminal, Ray's
relayed lines drop their colours (``RAY_COLOR_PREFIX=0``).
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
        address: A cluster (``auto``, ``host:6379``, ``ray://host:10001``) or ``"local"``; None:
            ``RAY_ADDRESS``, else local.
        **options: More of ``ray.init``'s arguments for a local Ray (``num_cpus``...).

    Returns:
        ``"already"`` when Ray was initialised before (nothing done), else ``"joined"`` or
        ``"started"``: end either with ``ray.shutdown()`` (it stops a Ray started here).

    Raises:
        ConfigurationError: The local Ray's node is not on loopback (no local-only switch); it is
            stopped again.
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

    Ray reads ``ENABLE_RAY_CLUSTER`` when it picks the node's address and hands that address to the
    processes it starts, so nothing later needs it; :func:`connect` checks the address got.
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
