"""A command's first connection: wait for a database that is restarting or failing over,
and end in one line on one that cannot be used (bad credentials, an unknown database) or
that stays out of reach."""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Callable

from django.core.management.base import CommandError
from django.db import connections

from django_sqlqueue.db.errors import is_unreachable
from django_sqlqueue.worker.faults import DatabaseUnreachable, one_line, wait_for_database

# Seconds a `manage.py sqlqueue` subcommand waits for a database it cannot reach before it
# exits 1; its --wait changes it (0 tries once). A worker waits as long as it takes.
CONNECT_WAIT = 30.0
UNREACHABLE = 1  # exit status when the database cannot be used


def add_wait_argument(parser: ArgumentParser) -> None:
    parser.add_argument("--wait", default=None, metavar="S",
                        help="Seconds to wait for a database that cannot be reached "
                             f"(restarting, failing over) before exiting 1 (default: "
                             f"{CONNECT_WAIT:g}; 0 tries once).")


def quietly(line: str) -> None:
    """A report that says nothing."""


def wait_for(alias: str, timeout: float | None,
             report: Callable[[str], object] | None = None) -> None:
    """Return once ``alias`` answers (see :func:`wait_for_database`); else raise a one-line
    CommandError (exit 1): at once for a refusal, after ``timeout`` seconds (None: never)
    for a database out of reach. An unknown alias is left to the command's own check."""
    if alias not in connections:
        return
    try:
        wait_for_database(alias, timeout=timeout, report=report)
    except DatabaseUnreachable as exc:
        raise CommandError(str(exc), returncode=UNREACHABLE) from exc
    except Exception as exc:
        raise CommandError(f"cannot use database {alias!r}: {one_line(exc)}",
                           returncode=UNREACHABLE) from exc


def lost(alias: str, exc: BaseException) -> CommandError | None:
    """The one-line error for a database lost in the middle of a command (a failover), or
    None when ``exc`` is something else."""
    if alias in connections and is_unreachable(exc, connections[alias].vendor):
        return CommandError(f"lost database {alias!r}: {one_line(exc)}", returncode=UNREACHABLE)
    return None
