"""Which database alias a ``manage.py sqlqueue`` subcommand uses: ``--database`` as given,
else the queue's database, or its read replica for the subcommands that may read one."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django_sqlqueue.conf import queue_database, read_database

# Subcommands that only read, for a person, and may show a lagging view: they read
# SQLQUEUE["READ_DATABASE"] unless --database names an alias. Not health: a probe must not
# fail (and restart containers) because a replica lags, nor pass on a stale view.
READ_REPLICA_SUBCOMMANDS = frozenset({"stats"})


def add_database_argument(parser: ArgumentParser, subcommand: str) -> None:
    replica = (", or its SQLQUEUE['READ_DATABASE'] when set"
               if subcommand in READ_REPLICA_SUBCOMMANDS else "")
    parser.add_argument("--database", default=None,
                        help="Database alias holding the queue tables (default: "
                             f"SQLQUEUE['DATABASE'], normally 'default'{replica}).")


def command_database(options: dict[str, Any]) -> str:
    """The alias the subcommand given in ``options`` uses."""
    if options.get("database"):
        return str(options["database"])
    if options.get("subcommand") in READ_REPLICA_SUBCOMMANDS:
        return read_database()
    return queue_database()
