"""``manage.py demo_embedded``: the shop served by uvicorn with the queue worker inside the
web process (example_project/asgi.py), no ``runqueueworker`` anywhere.

It starts uvicorn, places orders through HTTP, shows that the web process itself handled
their messages while it answered requests, then stops it with SIGTERM and shows that the
worker let go of its partitions on the way out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from django_sqlqueue.models import PartitionLease, SubscriberHeartbeat
from shop.models import HandlerRun

PROJECT_DIR = Path(__file__).resolve().parents[3]
DEMO_LOGS = PROJECT_DIR / "demo-logs"  # the server's log, one folder per run
START_TIMEOUT = 30.0  # seconds uvicorn gets to answer its first request
CONSUME_TIMEOUT = 60.0  # seconds the demo waits for the handlers
STOP_TIMEOUT = 60.0  # seconds uvicorn gets to stop (SHUTDOWN_GRACE is 30)
ORDERS = [("alice", "19.99"), ("bob", "5.00"), ("carol", "42.50"), ("dave", "7.25"),
          ("mallory", "-5.00")]


class Command(BaseCommand):
    help = "Serve the shop with uvicorn, the queue worker inside the web process."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            import uvicorn  # noqa: F401
        except ImportError as exc:
            raise CommandError("this demo needs uvicorn: pip install uvicorn "
                               "(make demo-embedded installs it)") from exc
        run_id = timezone.now().strftime("%Y%m%d-%H%M%S-%f")
        logs = DEMO_LOGS / run_id
        logs.mkdir(parents=True, exist_ok=True)
        self.stdout.write(f"django-sqlqueue embedded demo, run {run_id}, on {connection.vendor} "
                          f"({connection.settings_dict['NAME']})")
        server = _Server(logs / "uvicorn.log")
        try:
            self._run(server)
        finally:
            server.kill()
        self.stdout.write(self.style.SUCCESS("Done."))
        self.stdout.write(f"The server's log: {os.path.relpath(server.log)}")

    def _run(self, server: _Server) -> None:
        self._heading("1. uvicorn serves example_project/asgi.py: sqlqueue_asgi(get_asgi_application())")
        server.start()
        self._say(f"web process pid {server.pid} on {server.url}; the worker started with the "
                  "server's lifespan start-up, in a thread of its own")

        self._heading("2. Orders placed over HTTP; each answer comes back at once")
        placed = []
        for customer, total in ORDERS:
            started = time.monotonic()
            answer = server.post("/orders/", {"customer": customer, "total": total})
            took = (time.monotonic() - started) * 1000
            placed.append(answer["order"])
            self._say(f"POST /orders/ {customer:<8} {total:>6} -> order #{answer['order']} in "
                      f"{took:.0f} ms (web pid {answer['web_pid']})")
        if Decimal(ORDERS[-1][1]) <= 0:
            self._say(f"order #{placed[-1]} has a negative total: billing's handler fails it "
                      "three times, then dead-letters it")

        self._heading("3. The same process handled their messages: billing and emails")
        deadline = time.monotonic() + CONSUME_TIMEOUT
        while True:
            runs = [server.get(f"/orders/{pk}/")["runs"] for pk in placed]
            if all({"billing", "emails"} <= {r["group"] for r in order_runs}
                   for order_runs in runs) and len(runs[-1]) >= 4:
                break
            if time.monotonic() > deadline:
                raise CommandError(f"the handlers did not finish within {CONSUME_TIMEOUT:.0f} s; "
                                   f"see {server.log}")
            server.check_alive()
            time.sleep(0.2)
        for pk, order_runs in zip(placed, runs, strict=True):
            shown = ", ".join(f"{r['group']} #{r['attempt']} {'ok' if r['succeeded'] else 'failed'}"
                              for r in order_runs)
            self._say(f"order #{pk}: {shown}")
        pids = set(HandlerRun.objects.filter(order__in=placed).values_list("worker_pid", flat=True))
        self._say(f"handler pids: {', '.join(map(str, sorted(pids)))} (the web process: "
                  f"{server.pid})")

        self._heading("4. SIGTERM: uvicorn stops serving, the worker finishes and lets go")
        name = f"{socket.gethostname()}:{server.pid}"
        code = server.stop()
        held = PartitionLease.objects.filter(leased_by=name).count()
        live = SubscriberHeartbeat.objects.filter(subscriber_name=name, deregistered_at=0).count()
        self._say(f"uvicorn exited ({_status(code)}); leases still held by {name}: {held}; "
                  f"live heartbeats: {live}")
        if held or live:
            raise CommandError(f"the worker did not stop cleanly; see {server.log}")

    def _heading(self, text: str) -> None:
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(text))

    def _say(self, text: str) -> None:
        self.stdout.write(f"   {text}")


class _Server:
    """One uvicorn process serving the example project on a free local port."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid if self.process else 0

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(  # noqa: S603 - this interpreter, fixed arguments
                [sys.executable, "-m", "uvicorn", "example_project.asgi:application",
                 "--app-dir", str(PROJECT_DIR), "--host", "127.0.0.1", "--port", str(self.port),
                 "--lifespan", "on"],
                cwd=PROJECT_DIR, env=os.environ.copy(), stdout=out, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            self.check_alive()
            with contextlib.suppress(OSError):
                self._request("/admin/login/")
                return
            if time.monotonic() > deadline:
                raise CommandError(f"uvicorn did not answer within {START_TIMEOUT:.0f} s; see "
                                   f"{self.log}")
            time.sleep(0.2)

    def get(self, path: str) -> dict[str, Any]:
        return dict(json.loads(self._request(path)))

    def post(self, path: str, fields: dict[str, str]) -> dict[str, Any]:
        return dict(json.loads(self._request(path, urllib.parse.urlencode(fields).encode())))

    def _request(self, path: str, data: bytes | None = None) -> bytes:
        with urllib.request.urlopen(self.url + path, data=data, timeout=10) as answer:  # noqa: S310 - a local http URL
            return bytes(answer.read())

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise CommandError(f"uvicorn exited early with status {self.process.returncode}; "
                               f"see {self.log}")

    def stop(self) -> int:
        assert self.process is not None  # noqa: S101 - started by step 1
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(STOP_TIMEOUT)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _status(code: int) -> str:
    # uvicorn re-raises the signal it stopped for once it has shut down.
    return "after SIGTERM, cleanly" if code in (0, -signal.SIGTERM) else f"with status {code}"
