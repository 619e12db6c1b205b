"""A PostgreSQL primary and a synchronous streaming replica on this machine.

Two new clusters of Debian's newest PostgreSQL (``initdb``, then ``pg_basebackup -R`` of
the primary), on ``$SQLQUEUE_PG_CLUSTER_PORT`` (default 25432) and the port after it, in
``<clusters directory>/pg``, trust authentication on 127.0.0.1 only. The primary names the
replica in ``synchronous_standby_names``, so a commit returns only once the replica has the
transaction: a failover loses no commit a client saw succeed. The replica has no
synchronous standby of its own, so once promoted it commits alone.

Clients reach whichever is the primary through libpq's multi-host string with
``target_session_attrs=read-write`` (:meth:`PgCluster.url`): the failover URL.
The shared server on 5432 is never touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import common
from .common import HOST, ClusterError

USER = "postgres"  # the operating-system user the servers run as, and the database user
DATABASE = "test"  # created on the primary, for the URLs printed
PORT_VARIABLE = "SQLQUEUE_PG_CLUSTER_PORT"
DEFAULT_PORT = 25432
REPLICA_NAME = "replica"  # its application_name, which synchronous_standby_names names
START_TIMEOUT = 60  # seconds


def pg_bin() -> Path:
    """The bin directory of the newest PostgreSQL installed from Debian's packages."""
    found = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").exists()]
    if not found:
        raise ClusterError("no /usr/lib/postgresql/*/bin/initdb: install Debian's postgresql "
                           "(apt-get install postgresql)")
    return max(found, key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)] or [0])


@dataclass
class Node:
    name: str  # its role when the cluster was made: primary or replica
    port: int
    data: Path
    log: Path

    @property
    def pid_file(self) -> Path:
        return self.data / "postmaster.pid"


class PgCluster:
    def __init__(self, directory: Path | None = None, port: int | None = None) -> None:
        self.directory = directory or common.base_directory() / "pg"
        port = port or common.env_port(PORT_VARIABLE, DEFAULT_PORT)
        self.primary = Node("primary", port, self.directory / "primary",
                            self.directory / "primary.log")
        self.replica = Node(REPLICA_NAME, port + 1, self.directory / "replica",
                            self.directory / "replica.log")
        self.nodes = (self.primary, self.replica)

    # ------------------------------------------------------------------ URLs

    def url(self, database: str = DATABASE) -> str:
        """The failover URL: both servers, and libpq picks the one that accepts writes."""
        hosts = ",".join(f"{HOST}:{node.port}" for node in self.nodes)
        return f"postgres://{USER}@{hosts}/{database}?target_session_attrs=read-write"

    def node_url(self, node: Node, database: str = DATABASE) -> str:
        return f"postgres://{USER}@{HOST}:{node.port}/{database}"

    def urls(self, database: str = DATABASE) -> dict[str, str]:
        return {"failover": self.url(database),
                "primary": self.node_url(self.primary, database),
                "replica": self.node_url(self.replica, database)}

    # ------------------------------------------------------------------ start, stop

    def start(self, fresh: bool = False) -> None:
        """Make and start the pair, or keep it when it runs as it should already (unless
        ``fresh``): the primary writable, the replica streaming from it synchronously."""
        if not fresh and self.healthy():
            return
        self.stop()
        common.ports_free([node.port for node in self.nodes], PORT_VARIABLE)
        common.reset_directory(self.directory, USER)
        bin_dir = pg_bin()
        self._postgres(bin_dir / "initdb", "-D", str(self.primary.data), "-U", USER,
                       "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
        self._configure(self.primary, f"""
listen_addresses = '{HOST}'
port = {self.primary.port}
unix_socket_directories = '{self.directory}'
cluster_name = '{self.primary.name}'
max_connections = 200
shared_buffers = 64MB
wal_level = replica
max_wal_senders = 5
wal_keep_size = 256MB
# A commit returns once the replica has written it: a failover keeps every commit seen.
synchronous_standby_names = '{REPLICA_NAME}'
synchronous_commit = on
""")
        self._start(self.primary)
        self._postgres(bin_dir / "pg_basebackup", "-h", HOST, "-p", str(self.primary.port),
                       "-U", USER, "-D", str(self.replica.data), "-R", "-X", "stream",
                       "--checkpoint=fast", "--no-sync")
        # Later lines win: the replica's own port and name (its walreceiver's
        # application_name), and no synchronous standby of its own once promoted.
        self._configure(self.replica, f"""
port = {self.replica.port}
cluster_name = '{self.replica.name}'
synchronous_standby_names = ''
""")
        self._start(self.replica)
        common.wait_for("the replica did not become the primary's synchronous standby",
                        lambda: self._sync_state() == "sync", START_TIMEOUT, self.replica.log)
        self.query(self.primary, f'CREATE DATABASE "{DATABASE}"')

    def stop(self) -> None:
        """Stop both servers (fast shutdown), whichever still runs."""
        for node in self.nodes:
            if self.running(node):
                self._pg_ctl(node, "stop", "-m", "fast", "-w", "-t", str(START_TIMEOUT))

    def running(self, node: Node) -> bool:
        return common.alive(common.read_pid(node.pid_file))

    def healthy(self) -> bool:
        try:
            return (all(self.running(node) for node in self.nodes)
                    and self.query(self.primary, "SELECT pg_is_in_recovery()") == "f"
                    and self._sync_state() == "sync")
        except ClusterError:
            return False

    # ------------------------------------------------------------------ failover

    def stop_primary(self) -> int:
        """Stop the primary as a crash would (``-m immediate``: no checkpoint, clients cut
        off); return the pid it had."""
        pid = common.read_pid(self.primary.pid_file)
        self._pg_ctl(self.primary, "stop", "-m", "immediate", "-w")
        return pid

    def promote(self) -> None:
        """Promote the replica and wait until it accepts writes."""
        self._pg_ctl(self.replica, "promote", "-w", "-t", str(START_TIMEOUT))

    def answers(self) -> int:
        """The port of the server on which a client of the failover URL commits a write
        now, or 0."""
        hosts = ",".join(HOST for _ in self.nodes)
        ports = ",".join(str(node.port) for node in self.nodes)
        conninfo = (f"host={hosts} port={ports} user={USER} dbname=postgres "
                    "target_session_attrs=read-write connect_timeout=3")
        try:
            done = common.run([str(pg_bin() / "psql"), "-X", "-q", "-t", "-A", "-d", conninfo,
                               "-c", "SELECT inet_server_port() FROM txid_current()"],
                              timeout=10)
            return int(done.stdout.strip())
        except (ClusterError, ValueError):
            return 0

    def writable(self, node: Node) -> bool:
        try:
            return self.query(node, "SELECT pg_is_in_recovery()", timeout=5) == "f"
        except ClusterError:
            return False

    def state(self, node: Node) -> dict[str, Any]:
        """What the failover records of a server: its port and pid, whether it runs and
        whether it is a primary."""
        return {"node": node.name, "port": node.port,
                "pid": common.read_pid(node.pid_file), "running": self.running(node),
                "primary": self.running(node) and self.writable(node)}

    def describe(self) -> str:
        lines = []
        for node in self.nodes:
            if not self.running(node):
                lines.append(f"{node.name}: port {node.port}, stopped")
                continue
            role = "primary" if self.writable(node) else "standby"
            lines.append(f"{node.name}: port {node.port}, pid "
                         f"{common.read_pid(node.pid_file)}, {role}")
        if self.running(self.primary) and self.writable(self.primary):
            lines.append(f"replication to {REPLICA_NAME}: {self._sync_state() or 'none'}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ plumbing

    def query(self, node: Node, sql: str, timeout: float = 30) -> str:
        """``sql`` run by psql on ``node``'s postgres database; its output, unaligned."""
        done = common.run([str(pg_bin() / "psql"), "-h", HOST, "-p", str(node.port), "-U", USER,
                           "-d", "postgres", "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1",
                           "-c", sql], timeout=timeout)
        return done.stdout.strip()

    def _sync_state(self) -> str:
        return self.query(self.primary, "SELECT sync_state FROM pg_stat_replication "
                                        f"WHERE application_name = '{REPLICA_NAME}'")

    def _configure(self, node: Node, settings: str) -> None:
        with (node.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# clusters/pg.py\n" + settings.lstrip())

    def _start(self, node: Node) -> None:
        self._pg_ctl(node, "start", "-w", "-t", str(START_TIMEOUT), "-l", str(node.log))

    def _pg_ctl(self, node: Node, *args: str) -> None:
        self._postgres(pg_bin() / "pg_ctl", "-D", str(node.data), *args)

    def _postgres(self, program: Path, *args: str) -> None:
        """Run a server program as the postgres user, from the cluster's directory."""
        common.run(common.as_user(USER, [str(program), *args]), timeout=START_TIMEOUT + 30,
                   cwd=self.directory)
