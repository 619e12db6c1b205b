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
        from .models.task_results import reopen_replayed_tasks
        from .scheduling.definitions import sync_after_migrate
        from .sequencing import record_topics_after_migrate
        from .signals import dead_letters_replayed

        post_migrate.connect(create_search_indexes, sender=self)
        post_migrate.connect(record_topics_after_migrate, sender=self)
        post_migrate.connect(sync_after_migrate, sender=self)
        dead_letters_replayed.connect(reopen_replayed_tasks,
                                      dispatch_uid="django_sqlqueue.reopen_replayed_tasks")
