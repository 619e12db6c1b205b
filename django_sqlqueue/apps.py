from __future__ import annotations

from django.apps import AppConfig


class SQLQueueConfig(AppConfig):
    name = "django_sqlqueue"
    label = "django_sqlqueue"
    verbose_name = "SQL queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from . import checks  # noqa: F401  (registers the system checks)
        from .models.payload_search import create_search_indexes

        post_migrate.connect(create_search_indexes, sender=self)
