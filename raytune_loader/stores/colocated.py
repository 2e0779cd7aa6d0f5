"""A store whose server runs on this node: :func:`server_on_this_node` and its CPU.

A MinIO beside the trainer, a gateway on the head node, or a test server on loopback
serves its GETs from the cores the workers and the step need. Its CPU-seconds a request
are then a cost of the candidate like a worker's, and the cost model counts them where
the cores are shared; a store elsewhere (S3 itself) costs the node none.

The server is found by its endpoint: a host that is one of this node's addresses, and
every process listening on its port (a server of several processes on one port counts
them all). What is not found is not counted: a server of another user's, whose sockets
this process cannot read, or one behind a forwarder (a container's port published by
``docker-proxy``, a tunnel), where the forwarder is what listens.
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


def server_on_this_node(endpoint_url: str | None) -> list[psutil.Process]:
    """The processes serving ``endpoint_url`` where they listen on this node; none for a
    store elsewhere, no endpoint (S3 itself), or a server this process cannot see."""
    if not endpoint_url:
        return []
    try:
        parsed = urlparse(endpoint_url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        if not parsed.hostname:
            return []
        hosts = {info[4][0] for info in socket.getaddrinfo(parsed.hostname, port)}
        if not any(_on_this_node(host) for host in hosts):
            return []
        sockets = psutil.net_connections(kind="inet")
        listening = (c for c in sockets if c.status == psutil.CONN_LISTEN)
        pids = {c.pid for c in listening if c.laddr.port == port and c.pid}
        return [psutil.Process(pid) for pid in sorted(pids)]
    except (OSError, ValueError, psutil.Error) as exc:  # no name, a bad port, sockets unread
        log.info("the store's server at %s not found on this node: %s", endpoint_url, exc)
    return []


def _on_this_node(host: str) -> bool:
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if address.is_loopback:
        return True
    mine = {a.address.split("%", 1)[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    return str(address) in mine


class ServerClock:
    """The CPU-seconds a server's processes spent between :meth:`start` and
    :meth:`seconds`; where one is this process (a server in the tests' own process), less
    what the calling thread spent meanwhile (its own requests' CPU, not the server's)."""

    def __init__(self, servers: list[psutil.Process]) -> None:
        self.servers = servers
        self._started: float | None = None

    def _now(self) -> float:
        total = 0.0
        for server in self.servers:
            if server.pid == os.getpid():  # this process: its own clock, finer than ticks
                total += time.process_time() - time.thread_time()
            else:
                times = server.cpu_times()
                total += times.user + times.system
        return total

    def start(self) -> bool:
        """Start counting; False where a server cannot be read (gone, or refused)."""
        try:
            self._started = self._now()
        except psutil.Error:
            self._started = None
        return self._started is not None

    def seconds(self) -> float | None:
        """The servers' CPU-seconds since :meth:`start`; None where one has exited or
        could not be read."""
        if self._started is None:
            return None
        with contextlib.suppress(psutil.Error):
            return max(0.0, self._now() - self._started)
        return None
