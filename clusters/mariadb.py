"""A second MariaDB server on this machine, for topics placed on a server of their own.

One ``mariadbd`` of Debian's ``mariadb-server`` with a data directory, socket and
temporary directory of its own in ``<clusters directory>/mariadb``, listening on
``$SQLQUEUE_MARIADB_SECOND_PORT`` (default 23306). The shared server on 3306 is never
touched. Tests and the scale-out benchmark stop and start it to see what an outage of
one of several servers does.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
from pathlib import Path

from . import common
from .common import HOST, ClusterError

USER = "root"  # without a password, as mariadb-install-db makes it
SERVER_USER = "mysql"  # the operating-system user the server runs as, when started by root
DATABASE = "test"  # created on the server, for the URL printed
PORT_VARIABLE = "SQLQUEUE_MARIADB_SECOND_PORT"
DEFAULT_PORT = 23306
START_TIMEOUT = 60  # seconds the server may take to start (crash recovery included)


class MariaDBServer:
    def __init__(self, directory: Path | None = None, port: int | None = None) -> None:
        self.directory = directory or common.base_directory() / "mariadb"
        self.port = port or common.env_port(PORT_VARIABLE, DEFAULT_PORT)
        self.data = self.directory / "data"
        self.config = self.directory / "my.cnf"
        self.pid_file = self.directory / "mariadbd.pid"
        self.log = self.directory / "error.log"

    def url(self, database: str = DATABASE) -> str:
        return f"mysql://{USER}@{HOST}:{self.port}/{database}"

    def urls(self, database: str = DATABASE) -> dict[str, str]:
        return {"failover": self.url(database)}

    # ------------------------------------------------------------------ start, stop

    def start(self, fresh: bool = False) -> None:
        """Make and start the server, or keep it when it runs already (unless ``fresh``)."""
        if not fresh and self.healthy():
            return
        install_db = common.require("mariadb-install-db", "mariadb-server")
        self.stop()
        common.ports_free([self.port], PORT_VARIABLE)
        owner = SERVER_USER if os.geteuid() == 0 else None
        common.reset_directory(self.directory, owner)
        (self.directory / "tmp").mkdir()
        self.config.write_text(self._config())
        if owner:
            shutil.chown(self.directory / "tmp", owner, owner)
        common.run([install_db, "--no-defaults", f"--datadir={self.data}",
                    f"--user={owner or getpass.getuser()}",
                    "--auth-root-authentication-method=normal", "--skip-test-db"],
                   timeout=START_TIMEOUT)
        self.resume()
        self.query(f"CREATE DATABASE IF NOT EXISTS `{DATABASE}` "
                   "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")

    def resume(self) -> None:
        """Start the server made by :meth:`start` again, on the data it had."""
        mariadbd = common.require("/usr/sbin/mariadbd", "mariadb-server")
        common.start_detached([mariadbd, f"--defaults-file={self.config}"],
                              self.directory / "mariadbd.out")
        common.wait_for("the second MariaDB server did not start", self.answers,
                        START_TIMEOUT, self.log)

    def shutdown(self) -> None:
        """Stop the server the way an operator does (SIGTERM: a normal shutdown); its
        clients' connections end and new ones are refused until :meth:`resume`."""
        common.stop_process(common.read_pid(self.pid_file), sig=signal.SIGTERM,
                            timeout=START_TIMEOUT)

    def stop(self) -> None:
        self.shutdown()

    def running(self) -> bool:
        return common.alive(common.read_pid(self.pid_file))

    def answers(self) -> bool:
        try:
            return self.query("SELECT 1", timeout=5) == "1"
        except ClusterError:
            return False

    def healthy(self) -> bool:
        return self.running() and self.answers()

    def describe(self) -> str:
        if not self.running():
            return f"mariadb: port {self.port}, stopped"
        return (f"mariadb: port {self.port}, pid {common.read_pid(self.pid_file)}, "
                + ("answering" if self.answers() else "not answering"))

    # ------------------------------------------------------------------ plumbing

    def query(self, sql: str, timeout: float = 30) -> str:
        done = common.run(["mariadb", "--no-defaults", "--protocol=TCP", f"--host={HOST}",
                           f"--port={self.port}", f"--user={USER}", "--connect-timeout=3",
                           "--batch", "--skip-column-names", "-e", sql], timeout=timeout)
        return done.stdout.strip()

    def _config(self) -> str:
        user = f"user = {SERVER_USER}\n" if os.geteuid() == 0 else ""
        return f"""[mysqld]
{user}datadir = {self.data}
port = {self.port}
bind-address = {HOST}
socket = {self.directory / "mariadbd.sock"}
# A temporary directory of its own: servers sharing one (/tmp) have crashed freeing each
# other's Aria temporary tables.
tmpdir = {self.directory / "tmp"}
pid-file = {self.pid_file}
log-error = {self.log}
character-set-server = utf8mb4
collation-server = utf8mb4_bin
max_connections = 300
innodb_buffer_pool_size = 128M
innodb_log_file_size = 48M
# As durable as the shared server: every commit flushed to disk.
innodb_flush_log_at_trx_commit = 1
skip-name-resolve
"""
