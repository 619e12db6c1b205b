"""The system check of ``SQLQUEUE["EMBEDDED"]`` (``sqlqueue.E110``), the embedded worker's
options. Registered by importing :mod:`django_sqlqueue.checks`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from ..conf import raw_settings
from ..docs import see
from .options import problems


@register("sqlqueue")
def check_embedded(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any,
) -> list[CheckMessage]:
    """Every bad ``EMBEDDED`` option at once (``E110``): a worker started from a web
    server's configuration would otherwise fail only when the server starts."""
    if not isinstance(getattr(settings, "SQLQUEUE", None), dict):
        return []  # E001
    hint = see("operating", "A worker inside the web process")
    return [Error(f"SQLQUEUE['EMBEDDED']{'' if problem.startswith('[') else ' '}{problem}.",
                  hint=hint, id="sqlqueue.E110")
            for problem in problems(raw_settings()["EMBEDDED"])]
