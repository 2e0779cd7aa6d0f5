"""A real S3 API on loopback for the tests and the experiments: moto's server, behind a
proxy of our own that adds what a real store has and a loopback server lacks.

:class:`S3Server` starts moto's ``ThreadedMotoServer`` (the S3 protocol, in pure
Python) and, in front of it, :class:`SlowProxy`: an HTTP/1.1 proxy that, request by
request (keep-alive connections do not hide it), waits ``ttfb_s`` before a response's
first byte, sends its body at ``bytes_per_s`` a request, and answers a share
``throttle`` of objects' GETs (not listings) with S3's own ``503 SlowDown``. Clients
reach it through the standard environment (``AWS_ENDPOINT_URL`` and test credentials,
:meth:`S3Server.env`). Both run in threads of the calling process and stop with the
context.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path

from env_for_tests import environment, free_port  # noqa: F401 - the tests' import

SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message></Error>"
)
CHUNK = 256 * 1024  # the body's pacing unit


@dataclass
class SlowProxy:
    """What the store adds to each request: time to first byte, a bandwidth cap per
    request, a share of objects' GETs throttled (``503 SlowDown``) and a share cut off
    mid-body (the connection dropped), Range ignored, or every object's GET denied
    (a bucket anyone may list whose objects are not theirs); what it did is counted:
    requests, objects' GETs answered whole by path, the most GETs in flight at once."""

    upstream: int
    ttfb_s: float = 0.0
    bytes_per_s: float | None = None
    throttle: float = 0.0
    cut: float = 0.0
    ranges: bool = True  # False: a GET's Range is dropped, the whole object answered
    deny: bool = False  # True: every object's GET answered 403 AccessDenied, lists not
    seed: int = 0
    port: int = field(default_factory=free_port)
    requests: int = 0
    gets: int = 0  # of them, objects' GETs (not listings)
    sent: int = 0  # the bytes of the objects' GETs' bodies
    throttled: int = 0
    cuts: int = 0
    answered: collections.Counter[str] = field(default_factory=collections.Counter)
    in_flight: int = 0
    peak_in_flight: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    def reseed(self) -> None:
        """Start the draws of faults again from the seed: which GETs from now on are
        throttled or cut does not depend on how many GETs came before."""
        self._random = random.Random(self.seed)

    def start(self) -> SlowProxy:
        ready = threading.Event()
        self.reseed()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            server = self._loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", self.port, backlog=512)
            )
            ready.set()
            try:
                self._loop.run_forever()
            finally:
                server.close()
                self._loop.run_until_complete(_closed(server))
                self._loop.close()

        self._thread = threading.Thread(target=run, name="slow-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    async def _serve(self, client: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        try:
            while True:
                try:
                    head = await client.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                method, target = head.split(b" ", 2)[:2]
                method = method.upper()
                head, expects = _without_expect(head)
                if not self.ranges:  # as some S3-compatible servers and HTTP caches do
                    head = b"\r\n".join(
                        ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"range:")
                    )
                if expects:  # boto3's PUT waits for this before it sends its body
                    out.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await out.drain()
                body = await _body(client, head, request=True)
                self.requests += 1
                fetch = method == b"GET" and b"?" not in target  # an object's GET, not a list
                self.gets += fetch
                # a fault is drawn only where it is on: one kind's draws do not move the other's
                if fetch and self.deny:
                    await _refuse(out, b"403 Forbidden", DENIED)
                    continue
                if fetch and self.throttle and self._random.random() < self.throttle:
                    self.throttled += 1
                    await _refuse(out, b"503 Slow Down", SLOWDOWN)
                    continue
                self.in_flight += fetch
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
                try:
                    up_writer.write(head + body)
                    await up_writer.drain()
                    reply = await up_reader.readuntil(b"\r\n\r\n")
                    payload = b"" if method == b"HEAD" else await _body(up_reader, reply)
                    if self.ttfb_s:
                        await asyncio.sleep(self.ttfb_s)
                    out.write(reply)
                    if fetch and payload and self.cut and self._random.random() < self.cut:
                        self.cuts += 1
                        out.write(payload[: len(payload) // 2])
                        await out.drain()
                        return  # the connection dropped mid-body
                    self.sent += len(payload) if fetch else 0  # before the client has it
                    await self._paced(out, payload)
                finally:
                    self.in_flight -= fetch
                if fetch and reply.split(b" ", 2)[1] in (b"200", b"206"):
                    self.answered[target.decode().split("/", 2)[-1]] += 1
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            up_writer.close()
            out.close()

    async def _paced(self, out: asyncio.StreamWriter, payload: bytes) -> None:
        if not self.bytes_per_s:
            out.write(payload)
            await out.drain()
            return
        # each piece goes out when the cap has let its last byte through since the first
        # byte was due: a wake-up that comes late (a busy host) is made up by the next,
        # not added to every piece after it
        clock = asyncio.get_running_loop().time
        began = clock()
        for start in range(0, len(payload), CHUNK):
            due = began + min(len(payload), start + CHUNK) / self.bytes_per_s
            await asyncio.sleep(max(0.0, due - clock()))
            out.write(payload[start : start + CHUNK])
            await out.drain()


async def _refuse(out: asyncio.StreamWriter, status: bytes, error: bytes) -> None:
    """An S3 error answer (``status``, the XML ``error``) in place of the store's."""
    out.write(b"HTTP/1.1 %s\r\nContent-Type: application/xml\r\n" % status
              + b"Content-Length: %d\r\n\r\n" % len(error) + error)  # fmt: skip
    await out.drain()


async def _closed(server: asyncio.Server) -> None:
    """Every connection's task ended, then the server."""
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await server.wait_closed()


def _without_expect(head: bytes) -> tuple[bytes, bool]:
    """A request's head without its ``Expect: 100-continue`` (the proxy answers it, and
    moto's own 100 would be taken for the reply), and whether it had one."""
    lines = head.split(b"\r\n")
    kept = [ln for ln in lines if not ln.lower().startswith(b"expect:")]
    return b"\r\n".join(kept), len(kept) < len(lines)


async def _body(reader: asyncio.StreamReader, head: bytes, request: bool = False) -> bytes:
    """A message's body as it came (Content-Length, or chunked), to pass on whole."""
    lines = head.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if "content-length" in fields:
        return await reader.readexactly(int(fields["content-length"]))
    if fields.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            parts.append(size_line + chunk)
            if size == 0:
                return b"".join(parts)
    status = lines[0].split(" ")
    if request or (len(status) > 1 and status[1] in ("204", "304")):
        return b""
    return b""  # moto sends a length with every body


class S3Server:
    """moto's S3 server on loopback and the proxy in front of it (see the module)."""

    def __init__(self, ttfb_s: float = 0.0, bytes_per_s: float | None = None,
                 throttle: float = 0.0, cut: float = 0.0) -> None:  # fmt: skip
        from moto.server import ThreadedMotoServer

        self.moto_port = free_port()
        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=self.moto_port, verbose=False)
        self.proxy = SlowProxy(self.moto_port, ttfb_s, bytes_per_s, throttle, cut)

    def __enter__(self) -> S3Server:
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
        self.moto.start()
        self.proxy.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.proxy.stop()
        self.moto.stop()

    @property
    def endpoint(self) -> str:
        """The proxy's URL: what clients are pointed at."""
        return f"http://127.0.0.1:{self.proxy.port}"

    def env(self) -> dict[str, str]:
        """The standard environment a client reads: the endpoint and test credentials."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}  # fmt: skip

    def client(self):  # noqa: ANN201 - boto3's client, for setting up buckets
        import boto3

        direct = f"http://127.0.0.1:{self.moto_port}"  # the setup skips the proxy's delays
        return boto3.client("s3", endpoint_url=direct, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")  # fmt: skip

    def reset(self) -> None:
        """Before a test: the proxy's faults off, its peak forgotten and its draws of
        faults started again from its seed (which GETs a test's faults hit does not depend
        on how many earlier tests sent), and no listing or count of an earlier test's
        shards left in this process."""
        from raytune_loader.sources import store_shards

        store_shards.LISTED.clear()
        store_shards.COUNTED.clear()
        self.proxy.ttfb_s = self.proxy.throttle = self.proxy.cut = 0.0
        self.proxy.peak_in_flight = 0
        self.proxy.ranges = True
        self.proxy.deny = False
        self.proxy.reseed()

    def upload_folder(self, folder: Path, bucket: str, prefix: str) -> int:
        """Every file under ``folder`` as ``prefix/<its path under folder>``; how many."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        for path in files:
            key = "/".join(x for x in (prefix, path.relative_to(folder).as_posix()) if x)
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
        return len(files)


def serve(ttfbs: list[str], bytes_per_s: float | None) -> None:
    """moto's server and one proxy per time to first byte in ``ttfbs`` (``0.03``, or
    ``0.03/0.01`` to throttle 1% of the GETs too), in this process, until stdin closes;
    prints ``moto_port proxy_port...`` on one line first (a server process of its own, so
    that a client's CPU time is its own)."""
    import logging
    import sys

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    proxies = []
    for spec in ttfbs:
        ttfb, _, throttle = spec.partition("/")
        pace = bytes_per_s if float(ttfb) else None
        proxies.append(SlowProxy(port, float(ttfb), pace, float(throttle or 0)).start())
    print(port, *(p.port for p in proxies), flush=True)
    if sys.stdout.isatty():  # a person, not an experiment reading the ports
        print(f"moto's S3 at http://127.0.0.1:{port} (no delay: upload through it)")
        for spec, proxy in zip(ttfbs, proxies, strict=True):
            print(f"a store {spec} s from its first byte: export AWS_ENDPOINT_URL="
                  f"http://127.0.0.1:{proxy.port} AWS_ACCESS_KEY_ID=testing "
                  "AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1")  # fmt: skip
        print("Ctrl-D (the end of stdin) stops them", flush=True)
    sys.stdin.read()
    for proxy in proxies:
        proxy.stop()
    moto.stop()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        description="moto's S3 on loopback behind one proxy per time to first byte, until "
        "stdin closes; prints the moto port and the proxies' ports on one line first"
    )
    parser.add_argument("ttfbs", help="seconds to first byte, comma-separated, one proxy "
                        "each; 0.03/0.01 answers 1%% of the GETs 503 SlowDown too")  # fmt: skip
    parser.add_argument("bytes_per_s", nargs="?", type=float, default=None,
                        help="a request's bytes/s, behind the proxies that delay")  # fmt: skip
    args = parser.parse_args()
    serve(args.ttfbs.split(","), args.bytes_per_s)
