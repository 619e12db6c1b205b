"""Make the database itself refuse chosen writes, with a trigger: a real, lasting failure
of one statement (a value no check foresaw, a bug) for the worker to cope with, on every
backend, without touching the worker's code."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

REFUSAL = "refused by a test trigger"


def contains(column: str, text: str) -> str:
    """SQL true when the trigger's new row has ``text`` in ``column``."""
    function = "strpos" if connection.vendor == "postgresql" else "instr"
    return f"{function}(NEW.{column}, '{text}') > 0"


@contextmanager
def refusing(name: str, table: str, event: str, condition: str) -> Iterator[None]:
    """While inside, every ``event`` ("INSERT" or "UPDATE") on ``table`` whose new row
    meets ``condition`` (SQL over ``NEW.column``) fails with an error that is no
    contention and no lost connection."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"CREATE TRIGGER {name} BEFORE {event} ON {table} WHEN {condition} "
                           f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END")
        elif connection.vendor == "mysql":
            cursor.execute(f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW "
                           f"BEGIN IF {condition} THEN SIGNAL SQLSTATE '45000' "
                           f"SET MESSAGE_TEXT = '{REFUSAL}'; END IF; END")
        else:
            cursor.execute(f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                           f"BEGIN IF {condition} THEN RAISE EXCEPTION '{REFUSAL}'; END IF; "
                           "RETURN NEW; END $$")
            cursor.execute(f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW "
                           f"EXECUTE FUNCTION {name}()")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
                cursor.execute(f"DROP FUNCTION IF EXISTS {name}()")
            else:
                cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
