"""The system checks of where the queue's tables live: ``SQLQUEUE["DATABASE"]``
(``sqlqueue.E016``, ``E017``) and the aliases ``SQLQUEUE["TOPICS"]`` places topics on
(``sqlqueue.E019``). Registered by importing :mod:`django_sqlqueue.checks`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from .conf import database_configured, raw_settings
from .docs import see


@register("sqlqueue")
def check_queue_database(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any,
) -> list[CheckMessage]:
    """``SQLQUEUE["DATABASE"]`` names a configured alias (``E017``) that the routers send
    the app's models to (``E016``): otherwise ``publish()`` and the Django ORM would write
    to one database and the worker read another."""
    if not database_configured():
        return []  # the routers decide, and everything follows them
    alias = raw_settings()["DATABASE"]
    hint = see("operating", "The queue on a database of its own")
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        known = ", ".join(map(repr, settings.DATABASES))
        return [Error(f"SQLQUEUE['DATABASE'] must name an alias of DATABASES ({known}), got "
                      f"{alias!r}.", hint=hint, id="sqlqueue.E017")]
    from django.apps import apps
    from django.db import router

    model = apps.get_model("django_sqlqueue", "QueueMessage")
    routed = {"db_for_write": router.db_for_write(model), "db_for_read": router.db_for_read(model)}
    wrong = {name: answer for name, answer in routed.items() if answer != alias}
    if wrong or not router.allow_migrate_model(alias, model):
        answers = ", ".join(f"{name} answers {answer!r}" for name, answer in wrong.items())
        return [Error(
            f"SQLQUEUE['DATABASE'] is {alias!r}, but DATABASE_ROUTERS do not send the "
            f"django_sqlqueue app there ({answers or 'allow_migrate refuses it'}): publish() "
            "and the workers would use different databases.",
            hint="Add 'django_sqlqueue.routers.QueueRouter' to DATABASE_ROUTERS, before any "
            "router that claims every app. " + hint,
            id="sqlqueue.E016",
        )]
    return []


@register("sqlqueue")
def check_topic_databases(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any,
) -> list[CheckMessage]:
    """Every alias a topic is placed on (``SQLQUEUE["TOPICS"][name]["DATABASE"]``) gets the
    queue's tables from ``migrate`` (``E019``): the routers must allow the app there."""
    topics = raw_settings()["TOPICS"]
    if not isinstance(topics, dict):
        return []  # E015
    from django.apps import apps
    from django.db import router

    model = apps.get_model("django_sqlqueue", "QueueMessage")
    errors: list[CheckMessage] = []
    for topic, options in topics.items():
        alias = options.get("DATABASE") if isinstance(options, dict) else None
        if not isinstance(alias, str) or alias not in settings.DATABASES:
            continue  # none, or reported by check_settings
        if not router.allow_migrate_model(alias, model):
            errors.append(Error(
                f"SQLQUEUE['TOPICS'][{topic!r}] places the topic on {alias!r}, but "
                "DATABASE_ROUTERS refuse to migrate the django_sqlqueue app there: its "
                "tables would be missing.",
                hint="Add 'django_sqlqueue.routers.QueueRouter' to DATABASE_ROUTERS, before "
                "any router that claims every app. "
                + see("operating", "When one server is not enough"),
                id="sqlqueue.E019",
            ))
    return errors
