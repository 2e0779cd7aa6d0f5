"""A store whose server runs on this node: :func:`server_on_this_node` and its CPU.

A MinIO beside the trainer, a gateway on the head node, or a test server on loopback
serves its GETs from the cores the workers and the step need. Its CPU-seconds a request
are then a cost of the candidate like a worker's, and the cost model counts them where
the cores are shared; a store elsewhere (S3 itself) costs the node none.

The server is found by its endpoint: a host that is one of this node's addresses, and
the process listening on its port (a process of another user, whose sockets this
process cannot read, is not found: its cost is then not counted).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import time
from urllib.parse import urlparse

import psutil

log = logging.getLogger(__name__)


def server_on_this_node(endpoint_url: str | None) -> psutil.Process | None:
    """The process serving ``endpoint_url`` where it listens on this node; None for a
    store elsewhere, no endpoint (S3 itself), or a server this process cannot see."""
    if not endpoint_url:
        return None
    parsed = urlparse(endpoint_url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        hosts = {info[4][0] for info in socket.getaddrinfo(parsed.hostname, port)}
        if not any(_on_this_node(host) for host in hosts):
            return None
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
                return psutil.Process(conn.pid)
    except (OSError, psutil.Error) as exc:  # no name, or the sockets not readable
        log.info("the store's server at %s not found on this node: %s", endpoint_url, exc)
    return None


def _on_this_node(host: str) -> bool:
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if address.is_loopback:
        return True
    mine = {a.address.split("%", 1)[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    return str(address) in mine


class ServerClock:
    """The CPU-seconds a server process spent between :meth:`start` and :meth:`seconds`;
    where it is this process (a server in the tests' own process), less what the calling
    thread spent meanwhile (its own requests' CPU, not the server's)."""

    def __init__(self, server: psutil.Process) -> None:
        self.server = server
        self._own = server.pid == os.getpid()
        self._started = (0.0, 0.0)

    def _now(self) -> tuple[float, float]:
        times = self.server.cpu_times()
        return times.user + times.system, time.thread_time() if self._own else 0.0

    def start(self) -> None:
        """Start counting."""
        self._started = self._now()

    def seconds(self) -> float | None:
        """The server's CPU-seconds since :meth:`start`; None where it has exited."""
        with contextlib.suppress(psutil.Error):
            server, caller = self._now()
            return max(0.0, (server - self._started[0]) - (caller - self._started[1]))
        return None
