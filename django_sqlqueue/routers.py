"""``QueueRouter``: the queue's tables on a database of their own.

    DATABASE_ROUTERS = ["django_sqlqueue.routers.QueueRouter"]
    SQLQUEUE = {"DATABASE": "queue"}

Reads, writes and migrations of the app's models go to ``SQLQUEUE["DATABASE"]``; every
other app is left to the next router (or Django's default). See docs/operating.md.
"""

from __future__ import annotations

from typing import Any

from .conf import get_settings, queue_aliases

APP_LABEL = "django_sqlqueue"


def _is_queue_model(model: Any) -> bool:
    return getattr(getattr(model, "_meta", None), "app_label", None) == APP_LABEL


class QueueRouter:
    """Routes the app's models to ``SQLQUEUE["DATABASE"]`` (``"default"`` unless set), and
    migrates them there and on every alias ``SQLQUEUE["TOPICS"]`` places a topic on (the
    code reaching those names its alias)."""

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        # The queue's database, never its read replica (SQLQUEUE["READ_DATABASE"]):
        # publish(), the worker and the operations read rows and then write on what they
        # read. The few places that may show a lagging view ask conf.read_database().
        return get_settings().database if _is_queue_model(model) else None

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return get_settings().database if _is_queue_model(model) else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        # The queue's rows relate only to each other (they name other rows by value, never
        # by a foreign key): between two of them, yes; otherwise no opinion, and Django's
        # default allows a relation only within one database.
        if _is_queue_model(obj1) and _is_queue_model(obj2):
            return True
        return None

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None,
                      **hints: Any) -> bool | None:
        if app_label != APP_LABEL:
            return None
        # The queue's alias and every alias SQLQUEUE["TOPICS"] places a topic on.
        return db in queue_aliases()
