"""PgBouncer in transaction pooling mode in front of the shared PostgreSQL server.

Debian's ``pgbouncer`` on a local port of its own (``$SQLQUEUE_PGBOUNCER_PORT``, default
26432), forwarding every database to 127.0.0.1:5432 as the ``postgres`` user with trust
authentication, with a small pool (``default_pool_size = 5``) so clients really share
server connections. Its configuration, pid file and log live under
``.test-data/pgbouncer`` (``$SQLQUEUE_CLUSTERS_DIR/pgbouncer`` when set).

    python -m clusters.pgbouncer start [DATABASE]   # prints the URL through the pooler
    python -m clusters.pgbouncer stop

Self-contained (only the standard library) so the tests can use :class:`PgBouncer` as a
context manager.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from . import common

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
PORT_VARIABLE = "SQLQUEUE_PGBOUNCER_PORT"
DEFAULT_PORT = 26432  # below Linux's ephemeral ports, where a client's socket could take it
SERVER_PORT = 5432
USER = "postgres"  # the database user
OS_USER = "postgres"  # the operating-system user pgbouncer runs as when started by root
DATABASE = "test"
POOL_SIZE = 5
START_TIMEOUT = 20.0  # seconds


class PgBouncerError(RuntimeError):
    """PgBouncer could not be started or stopped; the message says why."""


def base_directory() -> Path:
    configured = os.environ.get("SQLQUEUE_CLUSTERS_DIR")
    return (Path(configured).resolve() if configured else ROOT / ".test-data") / "pgbouncer"


def binary() -> str:
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None)
    if found is None:
        raise PgBouncerError("pgbouncer is not installed (apt-get install -y pgbouncer)")
    return found


def env_port() -> int:
    text = os.environ.get(PORT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_PORT
    if not text.isdecimal() or not 1024 <= int(text) <= 65000:
        raise PgBouncerError(f"{PORT_VARIABLE} must be a port number from 1024 to 65000, "
                             f"got {text!r}")
    return int(text)


class PgBouncer:
    """One pgbouncer process; ``with PgBouncer() as bouncer:`` starts and stops it."""

    def __init__(self, directory: Path | None = None, port: int | None = None,
                 pool_size: int = POOL_SIZE, idle_transaction_timeout: int = 60) -> None:
        self.directory = directory or base_directory()
        self.port = port or env_port()
        self.pool_size = pool_size
        self.idle_transaction_timeout = idle_transaction_timeout

    @property
    def config(self) -> Path:
        return self.directory / "pgbouncer.ini"

    @property
    def pid_file(self) -> Path:
        return self.directory / "pgbouncer.pid"

    @property
    def log_file(self) -> Path:
        return self.directory / "pgbouncer.log"

    def url(self, database: str = DATABASE) -> str:
        return f"postgres://{USER}@{HOST}:{self.port}/{database}"

    def start(self) -> None:
        """Start pgbouncer (stopping one left running from an earlier start)."""
        self.stop()
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "userlist.txt").write_text(f'"{USER}" ""\n')
        self.config.write_text(f"""\
[databases]
* = host={HOST} port={SERVER_PORT} user={USER}

[pgbouncer]
listen_addr = {HOST}
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.directory / 'userlist.txt'}
pool_mode = transaction
default_pool_size = {self.pool_size}
max_client_conn = 200
idle_transaction_timeout = {self.idle_transaction_timeout}
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {self.log_file}
pidfile = {self.pid_file}
admin_users = {USER}
""")
        command = [binary(), "-d", "-q", str(self.config)]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            shutil.chown(self.directory, OS_USER)
            for path in self.directory.iterdir():
                shutil.chown(path, OS_USER)
            command = ["runuser", "-u", OS_USER, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True,  # noqa: S603 - our own argv
                              timeout=START_TIMEOUT)
        if done.returncode:
            raise PgBouncerError("pgbouncer did not start: "
                                 f"{done.stderr.strip() or self._log_tail()}")
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                probe.settimeout(0.5)
                if probe.connect_ex((HOST, self.port)) == 0:
                    return
            time.sleep(0.05)
        raise PgBouncerError(f"pgbouncer did not listen on {HOST}:{self.port} within "
                             f"{START_TIMEOUT:.0f} s; see {self.log_file}")

    def _log_tail(self) -> str:
        try:
            return self.log_file.read_text().strip().splitlines()[-1]
        except (OSError, IndexError):
            return "no log"

    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Stop the pgbouncer this directory's pid file names, if it runs."""
        pid = self.pid()
        if pid is None:
            return
        # A pgbouncer this process started stays a zombie until reaped: common.alive()
        # counts it gone, where os.kill(pid, 0) would wait out the whole timeout.
        common.stop_process(pid, timeout=START_TIMEOUT)
        self.pid_file.unlink(missing_ok=True)

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("start", "stop"):
        print("usage: python -m clusters.pgbouncer start [DATABASE] | stop", file=sys.stderr)
        return 2
    bouncer = PgBouncer()
    try:
        if argv[0] == "start":
            bouncer.start()
            print(bouncer.url(argv[1] if len(argv) > 1 else DATABASE))
        else:
            bouncer.stop()
    except (PgBouncerError, subprocess.SubprocessError, OSError) as exc:
        print(f"pgbouncer: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
