"""The example's admin login, for looking at the queue in Django's admin (local use only)."""

from __future__ import annotations

from django.contrib.auth import get_user_model

ADMIN_USERNAME = "admin"
ADMIN_PASSWORD = "admin"  # noqa: S105 - the example project's local login, printed on purpose
ADMIN_URL = "http://127.0.0.1:8000/admin/"


def ensure_superuser() -> tuple[str, str]:
    """Create the example's superuser unless it exists; return its login."""
    users = get_user_model().objects
    if not users.filter(username=ADMIN_USERNAME).exists():
        users.create_superuser(ADMIN_USERNAME, password=ADMIN_PASSWORD)
    return ADMIN_USERNAME, ADMIN_PASSWORD
