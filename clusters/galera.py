"""Three MariaDB Galera nodes behind HAProxy, one writer node, on this machine.

Three ``mariadbd`` of Debian's ``mariadb-server`` with Debian's ``galera-4`` provider, each
with a data directory of its own in ``<clusters directory>/galera`` (node 1 bootstrapped
with ``--wsrep-new-cluster``, nodes 2 and 3 joining by rsync state transfer), and Debian's
``haproxy`` sending every connection to node 1, with nodes 2 and 3 as ``backup`` servers:
the way Galera is run for a queue, all writes on one node (docs/operating.md says why).
When node 1 fails its health check, HAProxy cuts its sessions and sends new connections to
node 2.

Ports, from ``$SQLQUEUE_GALERA_CLUSTER_PORT`` (default 23060) = P: HAProxy on P, the nodes
on P+1 .. P+3, their group communication on P+11 .., incremental state transfer on
P+21 .., full state transfer on P+31 ... The shared server on 3306 is never touched.
"""

from __future__ import annotations

import functools
import getpass
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import common
from .common import HOST, ClusterError

USER = "root"  # the database user, without a password (as mariadb-install-db makes it)
# The operating-system user the servers run as, when started by root: as root, the rsync
# daemon of a joining node's state transfer would drop to nobody and be refused its
# data directory.
SERVER_USER = "mysql"
DATABASE = "test"  # created on the cluster, for the URLs printed
CHECK_USER = "haproxy_check"  # HAProxy's health check logs in as this user, no password
PROBE_TABLE = f"`{DATABASE}`.`cluster_probe`"  # a row written to see whether writes commit
PORT_VARIABLE = "SQLQUEUE_GALERA_CLUSTER_PORT"
DEFAULT_PORT = 23060
NODES = 3
PROVIDERS = ("/usr/lib/galera/libgalera_smm.so", "/usr/lib/libgalera_smm.so")
START_TIMEOUT = 90  # seconds a node may take to start and synchronise (a state transfer)
# HAProxy's health check: every 500 ms, down after 2 failures, so a dead writer node is
# taken out of the rotation about a second after it died.
CHECK_INTERVAL_MS = 500
# A node marked down has its sessions cut (clients reconnect to the next node at once,
# instead of waiting on a dead one); when node 1 is back, the backup's sessions are cut so
# that writes return to one node.
SESSIONS = "on-marked-down shutdown-sessions on-marked-up shutdown-backup-sessions"


@dataclass
class Node:
    index: int
    port: int
    gcomm_port: int
    ist_port: int
    sst_port: int
    directory: Path

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def config(self) -> Path:
        return self.directory / "my.cnf"

    @property
    def pid_file(self) -> Path:
        return self.directory / "mariadbd.pid"

    @property
    def log(self) -> Path:
        return self.directory / "error.log"


class GaleraCluster:
    def __init__(self, directory: Path | None = None, port: int | None = None) -> None:
        self.directory = directory or common.base_directory() / "galera"
        self.proxy_port = port or common.env_port(PORT_VARIABLE, DEFAULT_PORT)
        base = self.proxy_port
        self.nodes = tuple(Node(i, base + i, base + 10 + i, base + 20 + i, base + 30 + i,
                                self.directory / f"node{i}") for i in range(1, NODES + 1))
        self.proxy_config = self.directory / "haproxy.cfg"
        self.proxy_pid_file = self.directory / "haproxy.pid"
        self.proxy_log = self.directory / "haproxy.log"

    # ------------------------------------------------------------------ URLs

    def url(self, database: str = DATABASE) -> str:
        """Through HAProxy: the writer node, whichever it is now."""
        return f"mysql://{USER}@{HOST}:{self.proxy_port}/{database}"

    def node_url(self, node: Node, database: str = DATABASE) -> str:
        return f"mysql://{USER}@{HOST}:{node.port}/{database}"

    def urls(self, database: str = DATABASE) -> dict[str, str]:
        urls = {"failover": self.url(database)}
        urls.update({node.name: self.node_url(node, database) for node in self.nodes})
        return urls

    # ------------------------------------------------------------------ start, stop

    def start(self, fresh: bool = False) -> None:
        """Make and start the three nodes and HAProxy, or keep them when they run as they
        should already (unless ``fresh``)."""
        if not fresh and self.healthy():
            return
        provider = next((p for p in PROVIDERS if Path(p).exists()), None)
        if provider is None:
            raise ClusterError("libgalera_smm.so not found: install Debian's galera-4 "
                               "(apt-get install galera-4)")
        mariadbd = common.require("/usr/sbin/mariadbd", "mariadb-server")
        install_db = common.require("mariadb-install-db", "mariadb-server")
        common.require("rsync", "rsync")  # the state transfer of a joining node
        haproxy = common.require("haproxy", "haproxy")
        self.stop()
        ports = [self.proxy_port] + [p for n in self.nodes
                                     for p in (n.port, n.gcomm_port, n.ist_port, n.sst_port)]
        common.ports_free(ports, PORT_VARIABLE)
        owner = SERVER_USER if os.geteuid() == 0 else None
        common.reset_directory(self.directory, owner)
        for node in self.nodes:
            node.directory.mkdir()
            (node.directory / "tmp").mkdir()
            node.config.write_text(self._config(node, provider))
            if owner:
                shutil.chown(node.directory, owner, owner)
                shutil.chown(node.directory / "tmp", owner, owner)
            # Nodes 2 and 3 get node 1's data by state transfer; an installed data
            # directory to start from costs a second and spares the joiner surprises.
            common.run([install_db, "--no-defaults", f"--datadir={node.data}",
                        f"--user={owner or getpass.getuser()}",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       timeout=START_TIMEOUT)
        for node in self.nodes:
            extra = ["--wsrep-new-cluster"] if node.index == 1 else []
            common.start_detached([mariadbd, f"--defaults-file={node.config}", *extra],
                                  node.directory / "mariadbd.out")
            common.wait_for(f"{node.name} did not join the cluster",
                            functools.partial(self._synced, node), START_TIMEOUT, node.log)
            if node.index == 1:
                # Replicated to the nodes that join next, with the rest of the data.
                self.query(node, f"CREATE USER IF NOT EXISTS '{CHECK_USER}'@'{HOST}'; "
                                 f"CREATE DATABASE IF NOT EXISTS `{DATABASE}` "
                                 "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin; "
                                 f"CREATE TABLE IF NOT EXISTS {PROBE_TABLE} "
                                 "(id INT PRIMARY KEY, at DATETIME(6))")
        common.wait_for("the cluster did not reach three nodes",
                        lambda: self._status(self.nodes[0], "wsrep_cluster_size") == str(NODES),
                        START_TIMEOUT)
        self.proxy_config.write_text(self._proxy_config())
        pid = common.start_detached([haproxy, "-f", str(self.proxy_config), "-db"],
                                    self.proxy_log)
        self.proxy_pid_file.write_text(f"{pid}\n")
        common.wait_for("HAProxy did not send a connection to node 1",
                        lambda: self.active_node() is self.nodes[0], 30, self.proxy_log)

    def stop(self) -> None:
        """Stop HAProxy and every node still running."""
        common.stop_process(common.read_pid(self.proxy_pid_file))
        for node in reversed(self.nodes):
            common.stop_process(common.read_pid(node.pid_file), timeout=START_TIMEOUT)

    def running(self, node: Node) -> bool:
        return common.alive(common.read_pid(node.pid_file))

    def healthy(self) -> bool:
        return (all(self.running(node) and self._synced(node) for node in self.nodes)
                and common.alive(common.read_pid(self.proxy_pid_file))
                and self.active_node() is self.nodes[0])

    # ------------------------------------------------------------------ failover

    def active_node(self) -> Node | None:
        """The node HAProxy sends a new connection to now, or None when none answers."""
        try:
            port = int(self._query_port(self.proxy_port, "SELECT @@port", timeout=5))
        except (ClusterError, ValueError):
            return None
        return next((node for node in self.nodes if node.port == port), None)

    def writer(self) -> Node | None:
        """The node a write through HAProxy commits on now, or None while none does. A
        node that answers may still be unable to commit: after a member dies, the others
        hold every commit until they have evicted it (``evs.suspect_timeout``, 5 s)."""
        try:
            port = int(self._query_port(
                self.proxy_port, f"REPLACE INTO {PROBE_TABLE} VALUES (1, NOW(6)); "
                                 "SELECT @@port", timeout=30))
        except (ClusterError, ValueError):
            return None
        return next((node for node in self.nodes if node.port == port), None)

    def kill(self, node: Node) -> int:
        """``kill -9`` of ``node``'s server, waiting until it is gone; return its pid."""
        pid = common.read_pid(node.pid_file)
        if not common.alive(pid):
            raise ClusterError(f"{node.name} is not running")
        common.stop_process(pid, sig=signal.SIGKILL)
        return pid

    def state(self, node: Node) -> dict[str, Any]:
        """What the failover records of a node: its port and pid, whether it runs, and
        whether it is a synced member of the primary component."""
        running = self.running(node)
        return {"node": node.name, "port": node.port, "pid": common.read_pid(node.pid_file),
                "running": running, "synced": running and self._synced(node)}

    def describe(self) -> str:
        lines = []
        active = self.active_node()
        for node in self.nodes:
            if not self.running(node):
                lines.append(f"{node.name}: port {node.port}, stopped")
                continue
            state = self._status(node, "wsrep_local_state_comment") or "not answering"
            size = self._status(node, "wsrep_cluster_size")
            lines.append(f"{node.name}: port {node.port}, pid {common.read_pid(node.pid_file)}, "
                         f"{state}, cluster size {size}"
                         + (", HAProxy's writer" if node is active else ""))
        proxy = common.read_pid(self.proxy_pid_file)
        lines.append(f"haproxy: port {self.proxy_port}, "
                     + (f"pid {proxy}" if common.alive(proxy) else "stopped"))
        return "\n".join(lines)

    # ------------------------------------------------------------------ plumbing

    def query(self, node: Node, sql: str, timeout: float = 30) -> str:
        return self._query_port(node.port, sql, timeout)

    def _query_port(self, port: int, sql: str, timeout: float = 30) -> str:
        done = common.run(["mariadb", "--no-defaults", "--protocol=TCP", f"--host={HOST}",
                           f"--port={port}", f"--user={USER}", "--connect-timeout=3",
                           "--batch", "--skip-column-names", "-e", sql], timeout=timeout)
        return done.stdout.strip()

    def _status(self, node: Node, name: str) -> str:
        try:
            line = self.query(node, f"SHOW GLOBAL STATUS LIKE '{name}'", timeout=10)
        except ClusterError:
            return ""
        return line.split("\t", 1)[1] if "\t" in line else ""

    def _synced(self, node: Node) -> bool:
        return self.running(node) and self._status(node, "wsrep_local_state_comment") == "Synced"

    def _config(self, node: Node, provider: str) -> str:
        members = ",".join(f"{HOST}:{n.gcomm_port}" for n in self.nodes)
        user = f"user = {SERVER_USER}\n" if os.geteuid() == 0 else ""
        return f"""[mysqld]
{user}datadir = {node.data}
port = {node.port}
bind-address = {HOST}
socket = {node.directory / "mariadbd.sock"}
# A temporary directory of its own: servers sharing one (/tmp) have crashed freeing each
# other's Aria temporary tables.
tmpdir = {node.directory / "tmp"}
pid-file = {node.pid_file}
log-error = {node.log}
character-set-server = utf8mb4
max_connections = 300
innodb_buffer_pool_size = 64M
innodb_log_file_size = 48M
# Galera's requirements: row-based replication, interleaved auto-increment locks.
binlog_format = ROW
default_storage_engine = InnoDB
innodb_autoinc_lock_mode = 2
# Durability comes from the other nodes: a commit returns once every node has it.
innodb_flush_log_at_trx_commit = 2
wsrep_on = ON
wsrep_provider = {provider}
wsrep_cluster_name = sqlqueue
wsrep_cluster_address = gcomm://{members}
wsrep_node_name = {node.name}
wsrep_node_address = {HOST}:{node.gcomm_port}
wsrep_provider_options = "gmcast.listen_addr=tcp://{HOST}:{node.gcomm_port};ist.recv_addr={HOST}:{node.ist_port};gcache.size=64M"
wsrep_sst_method = rsync
wsrep_sst_receive_address = {HOST}:{node.sst_port}
wsrep_slave_threads = 2
"""

    def _proxy_config(self) -> str:
        servers = "\n".join(
            f"    server {n.name} {HOST}:{n.port} check" + ("" if n.index == 1 else " backup")
            for n in self.nodes)
        return f"""global
    maxconn 2000

defaults
    mode tcp
    timeout connect 3s
    timeout client 1h
    timeout server 1h
    timeout check 2s

# Every connection to node 1 while it passes its check; the backups only when it fails
# (the first of them that passes), so all writes happen on one node.
listen galera
    bind {HOST}:{self.proxy_port}
    option mysql-check user {CHECK_USER} post-41
    default-server inter {CHECK_INTERVAL_MS} fall 2 rise 2 {SESSIONS}
{servers}
"""
