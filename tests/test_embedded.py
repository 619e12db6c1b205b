"""The embedded worker (:mod:`django_sqlqueue.embedded`) inside real uvicorn and gunicorn
processes, and its supervision and options in this process.

The servers serve ``tests/embedded_app.py`` against the test database, configured through
``SQLQUEUE_TEST_SETTINGS`` (``EMBEDDED``); handlers record the pid they ran in, which is
the web process's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.test.utils import override_settings

import django_sqlqueue as sqlqueue
from django_sqlqueue.embedded import runner as runner_module
from django_sqlqueue.embedded import sqlqueue_wsgi
from django_sqlqueue.embedded.runner import EmbeddedWorker
from django_sqlqueue.models import PartitionLease, SubscriberHeartbeat
from tests.testapp.models import Handled
from tests.worker_harness import (
    REPO_ROOT,
    wait_until,
    watermark,
    worker_env,
    worker_pool,
)

pytestmark = [pytest.mark.worker]

# How each server runs the worker (lifespan modes, the WSGI wrapper, the gunicorn hooks'
# options, restarts) is the same whatever the database: tested once, on SQLite. The
# guarantees (graceful stop, crash recovery, fair shares, order, fencing) run on all three.
server_plumbing = pytest.mark.skipif(
    connection.vendor != "sqlite",
    reason="how a server runs the worker does not depend on the database: tested on SQLite")

ORDERS = {"GROUP": ["billing"], "TOPIC": ["orders"], "CONCURRENCY": 2}
SERVER_START = 20.0  # seconds a server gets to answer its first request
STOP_TIMEOUT = 15.0  # seconds a server gets to exit after SIGTERM (SHUTDOWN_GRACE is 10)


@dataclass
class Server:
    """One web server process on ``port``, its output in ``log``."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str = "/admin/login/") -> tuple[int, float]:
        """GET ``path``: the status and the seconds it took."""
        started = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as answer:
            return answer.status, time.monotonic() - started

    def terminate(self) -> int:
        """SIGTERM, and the exit status; uvicorn re-raises the signal once it has shut
        down (-15): both that and 0 are a clean stop."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(STOP_TIMEOUT)
            return 0 if code == -signal.SIGTERM else code
        except subprocess.TimeoutExpired:
            raise AssertionError(f"server still running {STOP_TIMEOUT} s after SIGTERM\n"
                                 f"{self.output}") from None


@pytest.fixture
def servers(transactional_db, tmp_path) -> Iterator[list[Server]]:
    """Servers started by a test, stopped (killed after a grace) on the way out."""
    started: list[Server] = []
    yield started
    for server in started:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
    for server in started:
        try:
            server.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
        print(f"--- server pid {server.proc.pid} output:\n{server.output}")


def free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(servers: list[Server], tmp_path: Path, args: list[str],
                 embedded: dict[str, Any], settings: dict[str, Any] | None = None) -> Server:
    """Start a server with ``SQLQUEUE["EMBEDDED"] = embedded`` (and other ``settings``) and
    wait for its first answer."""
    port = free_port()
    log = tmp_path / f"server-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", *[a.replace("PORT", str(port)) for a in args]],
            cwd=REPO_ROOT, env=worker_env({**(settings or {}), "EMBEDDED": embedded}), stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Server(proc, port, log)
    servers.append(server)

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}\n{server.output}")
        with contextlib.suppress(OSError):
            return server.get()[0] == 200
        return False

    wait_until(answers, timeout=SERVER_START, interval=0.1, what="the server's first answer")
    return server


def uvicorn(servers: list[Server], tmp_path: Path, settings: dict[str, Any] | None = None,
            **embedded: Any) -> Server:
    return start_server(servers, tmp_path, [
        "uvicorn", "tests.embedded_app:asgi", "--host", "127.0.0.1", "--port", "PORT",
        "--lifespan", "on", "--log-level", "warning"], embedded, settings)


def gunicorn(servers: list[Server], tmp_path: Path, processes: int,
             settings: dict[str, Any] | None = None, **embedded: Any) -> Server:
    return start_server(servers, tmp_path, [
        "gunicorn", "-c", "tests/embedded_gunicorn.py", "-w", str(processes),
        "-b", "127.0.0.1:PORT", "tests.embedded_app:wsgi"], embedded, settings)


def holders(group: str = "billing", topic: str = "orders") -> Counter[str]:
    """Partitions held per worker name."""
    return Counter(PartitionLease.objects.filter(consumer_group=group, topic=topic)
                   .exclude(leased_by="").exclude(leased_by__isnull=True)
                   .values_list("leased_by", flat=True))


def handled_pids(topic: str = "orders") -> Counter[int]:
    return Counter(Handled.objects.filter(topic=topic).values_list("pid", flat=True))


# --------------------------------------------------------------------------- uvicorn


@server_plumbing
def test_uvicorn_serves_requests_while_its_worker_handles_messages(servers, tmp_path):
    server = uvicorn(servers, tmp_path, GROUP=["billing"], TOPIC=["slow"], CONCURRENCY=1)
    sqlqueue.publish("slow", {"sleep": 5.0}, key="a")
    wait_until(lambda: Handled.objects.filter(topic="slow").exists(), what="the handler starting")

    # The handler sleeps in the worker's thread; the event loop answers meanwhile, well
    # within the handler's 5 s (a busy machine slows the answers, never to the handler's).
    answers = [server.get()]
    assert watermark("billing", "slow", "a") == 0  # the handler still runs
    answers += [server.get() for _ in range(4)]
    assert all(status == 200 for status, _ in answers)
    assert max(took for _, took in answers) < 2.5
    assert handled_pids("slow") == {server.proc.pid: 1}
    wait_until(lambda: watermark("billing", "slow", "a") > 0, what="the message acked")


@server_plumbing
def test_without_lifespan_events_the_first_request_starts_the_worker(servers, tmp_path):
    server = start_server(servers, tmp_path, [
        "uvicorn", "tests.embedded_app:asgi", "--host", "127.0.0.1", "--port", "PORT",
        "--lifespan", "off", "--log-level", "warning"], ORDERS)  # its first answer starts it
    sqlqueue.publish("orders", {"n": 1}, key="k1")
    wait_until(lambda: handled_pids() == {server.proc.pid: 1}, what="the web process handling")


def test_sigterm_to_uvicorn_finishes_the_in_flight_message_and_releases_its_leases(
        servers, tmp_path):
    server = uvicorn(servers, tmp_path, GROUP=["billing"], TOPIC=["slow"], CONCURRENCY=1)
    message = sqlqueue.publish("slow", {"sleep": 1.0}, key="a")
    wait_until(lambda: Handled.objects.filter(topic="slow").exists(), what="the handler starting")

    assert server.terminate() == 0

    assert watermark("billing", "slow", "a") > 0, server.output  # acked before the exit
    assert list(Handled.objects.filter(offset=message.offset).values_list("attempt", flat=True)) == [1]
    assert holders(topic="slow") == Counter()
    name = f"{socket.gethostname()}:{server.proc.pid}"
    assert all(h.deregistered_at > 0
               for h in SubscriberHeartbeat.objects.filter(subscriber_name=name))


@server_plumbing
def test_a_crashed_embedded_worker_is_restarted_and_logged(servers, tmp_path):
    # A worker already running under the embedded worker's name makes it refuse to start
    # (runqueueworker's exit status 2) once the name stayed taken for a lease and a renewal
    # (short here): the supervisor restarts it until the name is free.
    short = {"LEASE_DURATION": 1.0, "RENEW_INTERVAL": 0.2}
    with worker_pool(tmp_path) as pool:
        rival = pool.start("clash", "--group", "billing", "--topic", "orders", settings=short)
        wait_until(lambda: holders() == {"clash": 12}, what="the rival holding the partitions",
                   watch=[rival])
        server = uvicorn(servers, tmp_path, short, NAME="clash", **ORDERS)
        wait_until(lambda: "restarting in" in server.output, what="a logged restart")
        rival.terminate()
        assert rival.wait_exit(STOP_TIMEOUT) == 0
    sqlqueue.publish("orders", {"n": 1}, key="k1")
    wait_until(lambda: handled_pids().get(server.proc.pid), what="the restarted worker handling")
    assert "embedded worker stopped unexpectedly name=clash status=2" in server.output


# --------------------------------------------------------------------------- gunicorn


def test_two_gunicorn_web_processes_share_the_partitions_fairly(servers, tmp_path):
    server = gunicorn(servers, tmp_path, 2, **ORDERS)
    wait_until(lambda: sorted(holders().values()) == [6, 6], what="a 6/6 share of orders")

    sqlqueue.publish_many("orders", [{"payload": n, "key": f"k{n:02}"} for n in range(24)])
    wait_until(lambda: sum(handled_pids().values()) >= 24, what="every order handled")
    pids = handled_pids()
    assert len(pids) == 2  # both web processes handled orders
    assert server.terminate() == 0
    assert holders() == Counter()


@server_plumbing
def test_the_wsgi_wrapper_runs_the_worker_in_a_server_without_hooks(servers, tmp_path):
    # gunicorn without the hooks, serving sqlqueue_wsgi(): the first request starts the
    # worker in the web process, and its exit stops it, leases released.
    server = start_server(servers, tmp_path, [
        "gunicorn", "-w", "1", "--graceful-timeout", "20", "--log-level", "warning",
        "-b", "127.0.0.1:PORT", "tests.embedded_app:wsgi_wrapped"], ORDERS)
    sqlqueue.publish("orders", {"n": 1}, key="k1")
    wait_until(lambda: sum(handled_pids().values()) == 1, what="the web process handling")
    [pid] = handled_pids()
    assert pid != server.proc.pid  # gunicorn's worker process, not its master
    assert server.terminate() == 0
    assert holders() == Counter()


@server_plumbing
def test_sigterm_to_gunicorn_finishes_the_in_flight_message(servers, tmp_path):
    server = gunicorn(servers, tmp_path, 1, GROUP=["billing"], TOPIC=["slow"], CONCURRENCY=1)
    sqlqueue.publish("slow", {"sleep": 1.0}, key="a")
    wait_until(lambda: Handled.objects.filter(topic="slow").exists(), what="the handler starting")

    assert server.terminate() == 0

    assert watermark("billing", "slow", "a") > 0, server.output  # acked before the exit
    assert Handled.objects.filter(topic="slow").count() == 1
    assert holders(topic="slow") == Counter()


def test_a_killed_web_process_s_message_is_redelivered_to_another(servers, tmp_path):
    # A visibility timeout of 2 s: the redelivery comes that long after the kill.
    gunicorn(servers, tmp_path, 2, {"VISIBILITY_TIMEOUT": 2.0}, GROUP=["billing"],
             TOPIC=["stuck"], CONCURRENCY=1)
    # Its first attempt hangs past the test: only the kill ends it. Later ones return.
    sqlqueue.publish("stuck", {"hang": 60}, key="a")
    first = wait_until(lambda: Handled.objects.filter(topic="stuck").first(),
                       what="the handler starting")
    os.kill(first.pid, signal.SIGKILL)

    # Another web process (the survivor, or the one gunicorn starts in its place) takes the
    # partition and gets the message again once its visibility timeout is over.
    again = wait_until(lambda: Handled.objects.filter(topic="stuck", attempt=2).first(),
                       what="the redelivery")
    assert again.pid != first.pid
    wait_until(lambda: watermark("billing", "stuck", "a") > 0, what="the message acked")


@server_plumbing
def test_gunicorn_runs_one_worker_when_asked_for_one_process(servers, tmp_path):
    server = gunicorn(servers, tmp_path, 2, PROCESSES="one", **ORDERS)
    wait_until(lambda: list(holders().values()) == [12], what="one worker holding orders")
    time.sleep(1.5)  # the other process tries the lock every second
    assert len(holders()) == 1
    sqlqueue.publish_many("orders", [{"payload": n, "key": f"k{n:02}"} for n in range(6)])
    wait_until(lambda: sum(handled_pids().values()) >= 6, what="every order handled")
    assert len(handled_pids()) == 1
    assert server.terminate() == 0


@server_plumbing
def test_when_the_one_process_running_the_worker_dies_another_takes_over(servers, tmp_path):
    gunicorn(servers, tmp_path, 2, {"LEASE_DURATION": 1.0, "RENEW_INTERVAL": 0.2},
             PROCESSES="one", **ORDERS)
    [first] = wait_until(lambda: list(holders()) if list(holders().values()) == [12] else None,
                         what="one worker holding orders")
    os.kill(int(first.rpartition(":")[2]), signal.SIGKILL)
    wait_until(lambda: list(holders().values()) == [12] and first not in holders(),
               what="another web process holding orders")


# --------------------------------------------------------------------------- in this process


class CrashingEngine:
    """Stands in for a Worker: its first run raises, later ones run until stopped."""

    runs = 0

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.exit_code = 0
        self.exit_reason = ""
        self.dispatcher = type("Dispatcher", (), {"shutdown": lambda self, wait: None})()

    def run(self) -> int:
        CrashingEngine.runs += 1
        if CrashingEngine.runs == 1:
            raise RuntimeError("engine failure")
        self.stopping.wait()
        return 0

    def stop(self) -> None:
        self.stopping.set()


def test_the_supervisor_restarts_a_crashed_engine_after_a_pause(monkeypatch, caplog, db):
    monkeypatch.setattr(runner_module, "RESTART_DELAY", 0.1)
    monkeypatch.setattr(EmbeddedWorker, "_engines", lambda self, plan: [CrashingEngine()])
    CrashingEngine.runs = 0
    worker = EmbeddedWorker(group=["billing"], topic=["orders"])
    assert worker.start()
    try:
        wait_until(lambda: worker.running and CrashingEngine.runs == 2, timeout=5,
                   what="the second run")
        assert worker.restarts == 1
        assert "embedded worker crashed" in caplog.text
        assert "restarting in 0.1s restarts=1" in caplog.text
    finally:
        assert worker.stop() == 0
    assert worker.wait(1)


def test_a_wsgi_worker_stays_off_under_the_autoreloader_unless_asked(monkeypatch, db):
    monkeypatch.setenv("RUN_MAIN", "true")
    app = sqlqueue_wsgi(lambda environ, start_response: [b"ok"], group=["billing"])
    assert app({}, lambda *args: None) == [b"ok"]
    assert not app.worker.started
    on = sqlqueue_wsgi(lambda environ, start_response: [b"ok"], autoreload=True)
    assert on.worker.overrides["autoreload"] is True
    from django_sqlqueue.embedded.options import embedded_options

    assert embedded_options(autoreload=True).active()
    assert not embedded_options().active()


def test_an_unknown_group_refuses_to_start_with_runqueueworkers_message(db):
    worker = EmbeddedWorker(group=["nope"])
    with pytest.raises(sqlqueue.ConfigurationError, match="unknown group\\(s\\): 'nope'; known:"):
        worker.start()
    assert not worker.started


@pytest.mark.parametrize(("embedded", "problem"), [
    ([], "SQLQUEUE['EMBEDDED'] must be a dict, got list."),
    ({"CONCURENCY": 2}, "SQLQUEUE['EMBEDDED'] has unknown key(s): 'CONCURENCY'"),
    ({"CONCURRENCY": 0}, "['CONCURRENCY'] must be a whole number from 1 to 1000, got 0."),
    ({"GROUP": [""]}, "['GROUP'] must be a list of names"),
    ({"ENABLED": "yes"}, "['ENABLED'] must be True or False, got 'yes'."),
    ({"PROCESSES": "all"}, "['PROCESSES'] must be one of 'every', 'one', got 'all'."),
])
def test_bad_embedded_settings_fail_the_system_checks(embedded, problem):
    with override_settings(SQLQUEUE={"EMBEDDED": embedded}):
        errors = [e for e in run_checks() if e.id == "sqlqueue.E110"]
    assert errors and problem in errors[0].msg


def test_the_deploy_checks_report_an_embedded_group_that_does_not_exist(db):
    with override_settings(SQLQUEUE={"EMBEDDED": {"GROUP": ["nope"]}}):
        errors = [e for e in run_checks(include_deployment_checks=True)
                  if e.id == "sqlqueue.E111"]
    assert errors and "unknown group(s): 'nope'" in errors[0].msg


# --------------------------------------------------------------------------- guarantees


FAST_LEASES = {"LEASE_DURATION": 1.5, "RENEW_INTERVAL": 0.3, "VISIBILITY_TIMEOUT": 2.0}


def test_two_web_processes_keep_each_keys_order_while_one_stops(servers, tmp_path):
    # batch_size=1 (strict mode): each key's messages one at a time, in publish order,
    # while partitions move from a web process that stops to the one that stays.
    expected: dict[str, list[int]] = {}
    for message in sqlqueue.publish_many("strict", [{"payload": {"n": n}, "key": f"s{n % 4}"}
                                                    for n in range(80)]):
        expected.setdefault(message.key, []).append(message.offset)
    first = uvicorn(servers, tmp_path, GROUP=["ordered"], TOPIC=["strict"], CONCURRENCY=2)
    uvicorn(servers, tmp_path, GROUP=["ordered"], TOPIC=["strict"], CONCURRENCY=2)
    wait_until(lambda: Handled.objects.filter(topic="strict").count() >= 20,
               what="a quarter of the messages handled")
    assert first.terminate() == 0  # its partitions go to the other web process
    wait_until(lambda: Handled.objects.filter(topic="strict").count() >= 80,
               what="every message handled")

    for key, offsets in expected.items():
        runs = list(Handled.objects.filter(topic="strict", key=key).order_by("handled_at", "id"))
        assert [r.offset for r in runs] == offsets, f"key {key} out of publish order"
        gaps = [b.handled_at - a.handled_at for a, b in zip(runs, runs[1:], strict=False)]
        assert min(gaps) >= 0.002, f"key {key}: overlapping runs ({min(gaps):.4f} s apart)"


def test_a_paused_web_process_cannot_ack_after_its_lease_was_taken(servers, tmp_path):
    paused = uvicorn(servers, tmp_path, FAST_LEASES, GROUP=["billing"], TOPIC=["slow"],
                     CONCURRENCY=1)
    message = sqlqueue.publish("slow", {"sleep": 1.5}, key="p")
    wait_until(lambda: Handled.objects.filter(topic="slow").exists(), what="the handler starting")
    paused.proc.send_signal(signal.SIGSTOP)  # mid-handler, past its lease and visibility
    try:
        other = uvicorn(servers, tmp_path, FAST_LEASES, GROUP=["billing"], TOPIC=["slow"],
                        CONCURRENCY=1)
        again = wait_until(
            lambda: Handled.objects.filter(topic="slow", offset=message.offset,
                                           attempt=2).first(),
            timeout=20, what="the other web process redelivering the message")
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    assert again.pid == other.proc.pid

    # The paused process's handler finishes; its ack is refused, and it never fetches again.
    wait_until(lambda: "lease lost" in paused.output, what="the paused process noticing")
    later = sqlqueue.publish_many("slow", [{"payload": {"sleep": 0}, "key": "p"}
                                           for _ in range(3)])
    wait_until(lambda: watermark("billing", "slow", "p") > 0
               and Handled.objects.filter(offset__in=[m.offset for m in later]).count() == 3,
               what="the later messages handled")
    assert set(Handled.objects.filter(offset__in=[m.offset for m in later])
               .values_list("pid", flat=True)) == {other.proc.pid}
    assert Handled.objects.filter(pid=paused.proc.pid).count() == 1


@server_plumbing
def test_the_web_process_runs_at_most_concurrency_handler_threads(servers, tmp_path):
    server = uvicorn(servers, tmp_path, GROUP=["pool"], TOPIC=["spread"], CONCURRENCY=2)
    wait_until(lambda: holders("pool", "spread"), what="the worker holding its partitions")
    idle = len(os.listdir(f"/proc/{server.proc.pid}/task"))  # its threads, handlers none yet
    sqlqueue.publish_many("spread", [{"payload": n} for n in range(300)])
    busiest = idle
    deadline = time.monotonic() + 20
    while Handled.objects.filter(topic="spread").count() < 300 and time.monotonic() < deadline:
        busiest = max(busiest, len(os.listdir(f"/proc/{server.proc.pid}/task")))
        time.sleep(0.02)
    assert Handled.objects.filter(topic="spread").count() == 300
    assert busiest - idle <= 2, f"{busiest - idle} threads beyond the idle {idle}"
