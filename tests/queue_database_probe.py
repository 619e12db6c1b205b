"""Migrate both databases of tests/settings_queue_database.py (the queue on an alias of its
own) and print each alias's tables as JSON. Run by tests/test_queue_database.py in a
process of its own, on two databases it created and named in ``SQLQUEUE_TEST_DB_NAME`` and
``SQLQUEUE_TEST_QUEUE_DB_NAME``.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings_queue_database"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    aliases = ("default", "queue")
    for alias in aliases:
        call_command("migrate", database=alias, verbosity=0)
    json.dump({alias: sorted(connections[alias].introspection.table_names())
               for alias in aliases}, sys.stdout)


if __name__ == "__main__":
    main()
