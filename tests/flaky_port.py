"""A local TCP port in front of the test database server that plays a failover: nothing
listening, connections accepted and closed at once (a proxy with no backend up), a server
that answers "not ready" (a Galera node not yet synced, a PostgreSQL standby being
promoted), then connections forwarded to the server (the new primary)."""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from collections.abc import Iterator

DOWN, CLOSING, NOT_READY, FORWARDING = "down", "closing", "not ready", "forwarding"
CHUNK = 65536
# What a server not ready for clients answers first. MariaDB: an error packet in place of
# its greeting, ER_UNKNOWN_COM_ERROR as Galera sends it before the node has synced.
_WSREP = b"\xff" + struct.pack("<H", 1047) + b"WSREP has not yet prepared node for application use"
MYSQL_NOT_READY = struct.pack("<I", len(_WSREP))[:3] + b"\x00" + _WSREP
# PostgreSQL: an ErrorResponse to the startup message, SQLSTATE 57P03 (cannot connect now).
_STARTING = b"SFATAL\0VFATAL\0C57P03\0Mthe database system is starting up\0\0"
PG_NOT_READY = b"E" + struct.pack("!I", len(_STARTING) + 4) + _STARTING
PG_ENCRYPTION_REQUESTS = {80877103, 80877104}  # SSLRequest, GSSENCRequest: answered "N"


class FlakyPort:
    """``port`` on 127.0.0.1, in one of three modes; ``set(mode)`` switches it."""

    def __init__(self, target_host: str, target_port: int, protocol: str) -> None:
        self.target = (target_host, target_port)
        self.protocol = protocol  # "mysql" or "postgres", for NOT_READY
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = int(probe.getsockname()[1])
        probe.close()
        self.mode = DOWN
        self.accepted = 0  # connections accepted so far
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []

    def set(self, mode: str) -> None:
        """Switch to ``mode``; leaving DOWN starts listening (a port that comes up late)."""
        self.mode = mode
        if mode != DOWN and self._listener is None:
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            listener.settimeout(0.1)
            self._listener = listener
            self._spawn(self._accept)

    def stop(self) -> None:
        self._stopped.set()
        for thread in self._threads:
            thread.join(2)
        if self._listener is not None:
            self._listener.close()

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            if self.mode == FORWARDING:
                self._spawn(self._forward, client)
            elif self.mode == NOT_READY:
                self._spawn(self._not_ready, client)
            else:
                client.close()

    def _not_ready(self, client: socket.socket) -> None:
        with client, contextlib.suppress(OSError):
            client.settimeout(2)
            if self.protocol == "mysql":
                client.sendall(MYSQL_NOT_READY)
                return
            while True:  # the client speaks first: maybe encryption requests, then startup
                length, code = struct.unpack("!II", _read(client, 8))
                if code not in PG_ENCRYPTION_REQUESTS:
                    break
                client.sendall(b"N")
            _read(client, length - 8)
            client.sendall(PG_NOT_READY)

    def _forward(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        with client, server:
            pair = {client: server, server: client}
            while not self._stopped.is_set():
                readable, _, _ = select.select(list(pair), [], [], 0.1)
                for sock in readable:
                    data = b""
                    with contextlib.suppress(OSError):
                        data = sock.recv(CHUNK)
                    if not data:
                        return
                    pair[sock].sendall(data)


def _read(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


@contextlib.contextmanager
def flaky_port(target_host: str, target_port: int, protocol: str) -> Iterator[FlakyPort]:
    port = FlakyPort(target_host, target_port, protocol)
    try:
        yield port
    finally:
        port.stop()
