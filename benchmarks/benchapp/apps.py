import os

from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    """Host app for the benchmark handlers (queues.py) and the baseline's jobs table."""

    name = "benchmarks.benchapp"
    label = "benchapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Worker processes of idle_queries (and of end_to_end with --profile) count the
        # statements they send; see statements.py. Off unless the variable is set.
        path = os.environ.get("SQLQUEUE_BENCH_STATEMENT_LOG")
        if path:
            from django.db import connection

            if connection.vendor == "mysql":
                from . import statements

                statements.install(path)
