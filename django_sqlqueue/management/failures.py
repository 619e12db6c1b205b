"""What goes wrong running a ``manage.py sqlqueue`` subcommand on one alias, as one
readable line and an exit status, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.core.management.base import CommandError
from django.db import DatabaseError

from django_sqlqueue import operations as ops
from django_sqlqueue.db.schema_state import NotMigrated, is_missing_schema, not_migrated_line
from django_sqlqueue.groups import GroupInUse, UnknownGroup
from django_sqlqueue.management import connecting

USAGE_ERROR = 2  # exit status for bad input and refused operations
NOT_MIGRATED = 1  # exit status when the queue tables are missing or behind the migrations


@contextmanager
def command_errors(using: str) -> Iterator[None]:
    """Turn what the block raises on ``using`` into a CommandError of one line: a refused
    operation (USAGE_ERROR), missing tables (NOT_MIGRATED), a connection lost mid-command."""
    try:
        yield
    except (ops.OperationError, GroupInUse, UnknownGroup) as exc:
        raise CommandError(str(exc), returncode=USAGE_ERROR) from exc
    except NotMigrated as exc:
        raise CommandError(exc.line, returncode=NOT_MIGRATED) from exc
    except DatabaseError as exc:
        if is_missing_schema(exc):
            raise CommandError(not_migrated_line(using), returncode=NOT_MIGRATED) from exc
        gone = connecting.lost(using, exc)  # lost mid-command (a failover): one line
        if gone is None:
            raise
        raise gone from exc
