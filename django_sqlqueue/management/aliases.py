"""Which database alias a ``manage.py sqlqueue`` subcommand uses: ``--database`` as given,
else the queue's database, or its read replica for the subcommands that may read one."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django_sqlqueue.conf import queue_aliases, queue_database, read_database

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


# Subcommands on what lives only on the queue's own alias, never on a topic's.
MAIN_ALIAS_SUBCOMMANDS = frozenset({"schedules"})


def command_database(options: dict[str, Any]) -> str:
    """The alias the subcommand given in ``options`` uses first (see
    :func:`command_databases`)."""
    return command_databases(options)[0][1]


def command_databases(options: dict[str, Any]) -> list[tuple[str, str]]:
    """(queue alias, alias to use) for each database the subcommand in ``options`` acts
    on: the one ``--database`` names; else the alias of its ``--topic``
    (``SQLQUEUE["TOPICS"]`` may place topics apart); else every queue alias, the queue's
    own first. The alias to use is the queue alias's read replica where one may serve."""
    if options.get("database"):
        alias = str(options["database"])
        return [(alias, alias)]
    subcommand = options.get("subcommand")
    topic = options.get("topic")
    if subcommand in MAIN_ALIAS_SUBCOMMANDS:
        found = [queue_database()]
    elif isinstance(topic, str) and topic:
        found = [queue_database(topic)]
    else:
        found = queue_aliases()
    replica = subcommand in READ_REPLICA_SUBCOMMANDS
    return [(alias, read_database(alias) if replica else alias) for alias in found]
