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


# A deployment check, as sqlqueue.W090 is: it imports every installed app's queues.py,
# which no other manage.py command needs.
@register("sqlqueue", deploy=True)
def check_embedded_selection(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any,
) -> list[CheckMessage]:
    """``E111`` when ``EMBEDDED``'s groups, topics or queues select nothing runnable: each
    web process would log the error and serve without a worker (gunicorn's hooks run no
    checks). Keyword arguments given in code are not seen here."""
    user = getattr(settings, "SQLQUEUE", None)
    if not isinstance(user, dict) or "EMBEDDED" not in user or check_embedded(app_configs):
        return []  # not used (or chosen in code only), or E110 comes first
    from django.core.management.base import CommandError

    from ..management.worker_selection import _select
    from .options import embedded_options

    options = embedded_options()
    if not options.enabled:
        return []
    try:
        _select(options.selection(), options.name or "check")
    except CommandError as exc:
        return [Error(f"SQLQUEUE['EMBEDDED'] selects no runnable subscription: {exc}.",
                      hint=see("operating", "A worker inside the web process"),
                      id="sqlqueue.E111")]
    return []
