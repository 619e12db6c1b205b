"""``python -m clusters {pg,galera,mariadb} [--stop | --status | --fresh | run -- COMMAND ...]``

Without an action: start the cluster (or keep it, when it runs as it should already) and
print its connection URLs. ``--stop`` stops it, ``--status`` describes it. ``run --
COMMAND`` starts a fresh cluster, runs COMMAND with the URLs in its environment
(``CLUSTER_PG_URL``, ``CLUSTER_PG_PRIMARY_URL``, ``CLUSTER_PG_REPLICA_URL``;
``CLUSTER_GALERA_URL``, ``CLUSTER_GALERA_NODE1_URL`` ... ``NODE3``; ``CLUSTER_MARIADB_URL``,
a second MariaDB server for topics placed on a server of their own), stops the cluster
and exits with COMMAND's status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from .common import ClusterError
from .galera import GaleraCluster
from .mariadb import MariaDBServer
from .pg import PgCluster

Cluster = PgCluster | GaleraCluster | MariaDBServer


def make(kind: str) -> Cluster:
    if kind == "mariadb":
        return MariaDBServer()
    return PgCluster() if kind == "pg" else GaleraCluster()


def environment(kind: str, cluster: Cluster) -> dict[str, str]:
    prefix = f"CLUSTER_{kind.upper()}"
    return {(prefix + "_URL" if name == "failover" else f"{prefix}_{name.upper()}_URL"): url
            for name, url in cluster.urls().items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clusters", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("pg", "galera", "mariadb"))
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--stop", action="store_true", help="stop the cluster")
    action.add_argument("--status", action="store_true", help="describe the cluster")
    action.add_argument("--fresh", action="store_true",
                        help="start anew even when the cluster runs already")
    parser.epilog = "run -- COMMAND ...: run COMMAND with a fresh cluster up, then stop it"
    argv = sys.argv[1:] if argv is None else argv
    command: list[str] = []
    if "run" in argv:
        at = argv.index("run")
        argv, command = argv[:at], argv[at + 1:]
        if command[:1] == ["--"]:
            command = command[1:]
        if not command:
            parser.error("run needs a command: run -- COMMAND ...")
    args = parser.parse_args(argv)
    cluster = make(args.kind)
    try:
        if args.stop:
            cluster.stop()
            print(f"clusters: {args.kind} stopped")
            return 0
        if args.status:
            print(cluster.describe())
            return 0
        cluster.start(fresh=args.fresh or bool(command))
        urls = environment(args.kind, cluster)
        for name, url in urls.items():
            print(f"{name}={url}", flush=True)
        if not command:
            return 0
        try:
            return subprocess.run(command, env={**os.environ, **urls}).returncode
        finally:
            cluster.stop()
    except ClusterError as exc:
        print(f"clusters: {args.kind}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
