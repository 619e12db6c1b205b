"""The wheel check's steps that run inside the wheel's virtualenv (see check.py).

    python in_venv.py PROJECT_DIR where|admin|publish|handled

Each step fails with an AssertionError naming what it found.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# This file's directory is in the checkout: keep it off the import path, so the only
# django_sqlqueue importable is the installed one.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, sys.argv[1])
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

import django  # noqa: E402

django.setup()

import django_sqlqueue  # noqa: E402

CUSTOMER = "wheel-check"


def where() -> None:
    venv = Path(os.environ["SQLQUEUE_WHEEL_VENV"]).resolve()
    installed = Path(django_sqlqueue.__file__).resolve()
    assert venv in installed.parents, f"django_sqlqueue imported from {installed}, not {venv}"
    assert sys.prefix != sys.base_prefix and Path(sys.prefix).resolve() == venv, sys.prefix
    print(f"django_sqlqueue from {installed}")


def admin() -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.urls import reverse

    setup_test_environment()  # the client records the templates each response used
    user, _ = get_user_model().objects.get_or_create(
        username="wheel", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    pages = {
        "admin:django_sqlqueue_overview": ("admin/django_sqlqueue/overview.html",
                                           'id="sqlqueue-overview"'),
        "admin:django_sqlqueue_deadletter_changelist": ("admin/django_sqlqueue/change_list.html",
                                                        'id="changelist"'),
    }
    for name, (template, marker) in pages.items():
        response = client.get(reverse(name))
        assert response.status_code == 200, f"{name}: HTTP {response.status_code}"
        used = {t.name for t in response.templates}
        assert template in used, f"{name} rendered {sorted(used)}, not {template}"
        assert marker in response.content.decode(), f"{name} lacks {marker}"
        print(f"{name}: 200, {template}")


def publish() -> None:
    from decimal import Decimal

    from shop.services import place_order

    order = place_order(CUSTOMER, Decimal("12.50"))
    print(f"placed order {order.pk}")


def handled() -> None:
    from shop.models import HandlerRun

    groups = sorted(HandlerRun.objects.filter(order__customer=CUSTOMER, succeeded=True)
                    .values_list("group", flat=True))
    assert groups == ["billing", "emails"], f"handlers that ran: {groups}"
    print(f"handled by {', '.join(groups)}")


if __name__ == "__main__":
    {"where": where, "admin": admin, "publish": publish, "handled": handled}[sys.argv[2]]()
