"""``manage.py admin_demo``: something to look at in the admin's queue pages.

Places orders that no worker is running to handle (so both groups show lag), makes sure
billing has a dead letter (a poison order, run through a worker until billing gives up),
and creates the example's superuser. ``make admin`` runs it before serving the example.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_sqlqueue.models import DeadLetter
from django_sqlqueue.sequencing import sequence_all
from shop.operator import ADMIN_URL, ensure_superuser
from shop.services import place_order

MANAGE_PY = Path(__file__).resolve().parents[3] / "manage.py"
LAGGING_ORDERS = 12
DEAD_LETTER_TIMEOUT = 60.0  # seconds


class Command(BaseCommand):
    help = "Leave some lag and a dead letter in the queue, and create the example's superuser."

    def handle(self, *args: Any, **options: Any) -> None:
        if not DeadLetter.objects.filter(consumer_group="billing").exists():
            self._make_a_dead_letter()
        for n in range(LAGGING_ORDERS):
            place_order(f"customer{n % 4}", Decimal(f"{10 + n}.00"))
        sequence_all()  # what a worker does first; the orders now count as lag
        username, password = ensure_superuser()
        self.stdout.write(
            f"Placed {LAGGING_ORDERS} orders no worker is handling yet (lag for billing and "
            f"emails); billing has {DeadLetter.objects.filter(consumer_group='billing').count()} "
            f"dead letter(s).")
        self.stdout.write(self.style.SUCCESS(
            f"Admin: {ADMIN_URL} (log in as {username} / {password}); the queue's overview is "
            f"at {ADMIN_URL}django_sqlqueue/overview/"))

    def _make_a_dead_letter(self) -> None:
        poison = place_order("mallory", Decimal("-5.00"))
        self.stdout.write(f"Order #{poison.pk} has a negative total; a worker runs until billing "
                          "gives up on it ...")
        worker = subprocess.Popen(  # noqa: S603 - this interpreter, fixed arguments
            [sys.executable, str(MANAGE_PY), "runqueueworker", "--name", "admin-demo"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=os.environ.copy())
        try:
            deadline = time.monotonic() + DEAD_LETTER_TIMEOUT
            while not DeadLetter.objects.filter(consumer_group="billing").exists():
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise CommandError("the worker did not dead-letter the poison order")
                time.sleep(0.2)
        finally:
            worker.terminate()
            worker.wait(timeout=60)
