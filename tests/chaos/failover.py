"""The chaos run on a cluster of this machine (``clusters/``): a failover instead of the
server restart, or the workers spread over every Galera node.

- ``--failover pg``: a primary and a synchronous replica; everybody connects through the
  multi-host URL with ``target_session_attrs=read-write``. Mid-run the primary is stopped
  as a crash would (``pg_ctl stop -m immediate``) and the replica promoted
  ``PROMOTE_AFTER`` seconds later, as a failover manager would once it noticed.
- ``--failover galera``: three Galera nodes behind HAProxy, one writer node. Mid-run the
  node HAProxy sends connections to is killed (``kill -9``).
- ``--galera-spread``: the same three nodes, no HAProxy: worker and publisher ``i``
  connect to node ``i mod 3``, so every node takes writes. No node is killed.

Each starts a fresh cluster, so a run never depends on what an earlier one left, and stops
it at the end. The failover is written to the fault records (``failover_down`` and
``failover_up``, with the server before and after) for ``verify.py``.
"""

from __future__ import annotations

import time
from typing import Any

from clusters.galera import GaleraCluster
from clusters.pg import PgCluster

from . import records

KINDS = ("pg", "galera")
PROMOTE_AFTER = 1.0  # seconds from the primary's death to the promotion
UP_TIMEOUT = 60.0  # seconds the new writer may take to answer
LISTENER_PREFIX = "sqlqueue listener "  # the wake-up listener's application_name


class ClusterRun:
    """A cluster the chaos run uses instead of ``DATABASE_URL``'s server."""

    kind = ""
    fails_over = True

    def __init__(self) -> None:
        self.cluster: Any = None

    def database_url(self) -> str:
        return str(self.cluster.url())

    def process_url(self, index: int) -> str | None:
        """The URL the ``index``-th worker or publisher connects with; None: the run's."""
        return None

    def start(self) -> None:
        self.cluster.start(fresh=True)

    def stop(self) -> None:
        self.cluster.stop()

    def describe(self) -> str:
        raise NotImplementedError

    def fail_over(self) -> float:
        """Make the writer fail and wait until a client commits a write on the new one;
        return how long clients could not write."""
        raise NotImplementedError


class PgFailover(ClusterRun):
    kind = "pg"

    def __init__(self) -> None:
        super().__init__()
        self.cluster = PgCluster()

    def describe(self) -> str:
        p, r = self.cluster.primary, self.cluster.replica
        return (f"the PostgreSQL primary (port {p.port}) stopped with -m immediate, the "
                f"synchronous replica (port {r.port}) promoted {PROMOTE_AFTER:g} s later")

    def fail_over(self) -> float:
        pg = self.cluster
        started = time.monotonic()
        records.write("faults", e="failover_down", kind=self.kind, server=pg.state(pg.primary))
        pg.stop_primary()
        time.sleep(PROMOTE_AFTER)
        pg.promote()
        _wait(lambda: pg.answers() == pg.replica.port, "the promoted replica")
        records.write("faults", e="failover_up", kind=self.kind, server=pg.state(pg.replica),
                      old=pg.state(pg.primary))
        return time.monotonic() - started


class GaleraFailover(ClusterRun):
    kind = "galera"

    def __init__(self) -> None:
        super().__init__()
        self.cluster = GaleraCluster()

    def describe(self) -> str:
        return (f"kill -9 of the Galera node HAProxy (port {self.cluster.proxy_port}) sends "
                "every connection to; HAProxy moves to a backup node")

    def fail_over(self) -> float:
        galera = self.cluster
        old = galera.active_node()
        if old is None:
            raise RuntimeError("HAProxy sends connections to no node")
        started = time.monotonic()
        records.write("faults", e="failover_down", kind=self.kind, server=galera.state(old))
        galera.kill(old)
        _wait(lambda: galera.writer() not in (None, old), "a backup node behind HAProxy")
        new = galera.writer()
        records.write("faults", e="failover_up", kind=self.kind, server=galera.state(new),
                      old=galera.state(old))
        return time.monotonic() - started


class GaleraSpread(ClusterRun):
    kind = "galera-spread"
    fails_over = False

    def __init__(self) -> None:
        super().__init__()
        self.cluster = GaleraCluster()

    def database_url(self) -> str:
        return str(self.cluster.node_url(self.cluster.nodes[0]))

    def process_url(self, index: int) -> str | None:
        nodes = self.cluster.nodes
        return str(self.cluster.node_url(nodes[index % len(nodes)]))

    def describe(self) -> str:
        ports = ", ".join(str(n.port) for n in self.cluster.nodes)
        return f"workers and publishers spread over the three Galera nodes ({ports}), no HAProxy"


def make(failover: str | None, spread: bool) -> ClusterRun | None:
    if spread:
        return GaleraSpread()
    if failover == "pg":
        return PgFailover()
    if failover == "galera":
        return GaleraFailover()
    return None


def listeners(connection: Any) -> int:
    """The wake-up listeners connected to the server ``connection`` is on (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
                       [LISTENER_PREFIX + "%"])
        return int(cursor.fetchone()[0])


def _wait(check: Any, what: str) -> None:
    deadline = time.monotonic() + UP_TIMEOUT
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer within {UP_TIMEOUT:g} s")
        time.sleep(0.05)
