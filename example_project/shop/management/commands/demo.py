"""``manage.py demo``: place some orders and show, step by step, what the queue's log holds.

Every step is a small function taking the :class:`Run`; ``handle()`` calls those listed in
``STEPS`` in order. To show more, write another step and add it to ``STEPS``.

Re-running is safe: nothing is reset. Each order gets a new primary key, so its message id
(``order-<pk>-placed``) is new too, and ids the demo makes up itself include the run id.
Rows from earlier runs stay in the database; the summary shows only this run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper
from django.core.management.color import Style
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

import django_sqlqueue as sqlqueue

# The demo reads the log table to show offsets and positions; applications never need to.
from django_sqlqueue.models import PartitionLease, QueueMessage, Schedule, SubscriberHeartbeat
from django_sqlqueue.sequencing import sequence_all
from shop.models import HandlerRun, Order
from shop.operator import ADMIN_URL, ensure_superuser
from shop.services import TOPIC, place_order, place_orders_in_bulk

SCHEDULE = "sales-report"  # SQLQUEUE["SCHEDULES"] in settings.py
REMINDER_TOPIC = "reminders"
REMINDER_DELAY = 30  # seconds
MANAGE_PY = Path(__file__).resolve().parents[3] / "manage.py"
DEMO_LOGS = MANAGE_PY.parent / "demo-logs"  # the workers' logs, one folder per run
WORKERS = ("demo-worker-1", "demo-worker-2")
CONSUME_TIMEOUT = 60.0  # seconds the demo waits for the workers before giving up


class PaymentDeclined(Exception):
    """Stands in for any error raised after place_order() but in the same transaction."""


@dataclass
class Run:
    id: str
    stdout: OutputWrapper
    style: Style
    first_offset: int  # log rows above this offset were written by this run
    orders: list[Order] = field(default_factory=list)
    poison: Order | None = None
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    worker_logs: Path | None = None

    def heading(self, text: str) -> None:
        self.stdout.write("")
        self.stdout.write(self.style.MIGRATE_HEADING(text))

    def say(self, text: str) -> None:
        self.stdout.write(f"   {text}")


# --------------------------------------------------------------------------- steps


def place_three_orders(run: Run) -> None:
    run.heading("1. Three orders, each published inside its order's transaction")
    for customer, total in [("alice", "19.99"), ("bob", "5.00"), ("alice", "42.50")]:
        order = place_order(customer, Decimal(total))
        run.orders.append(order)
        message = _message_of(order)
        run.say(
            f"order #{order.pk} {customer:<6} {total:>6}  ->  offset {message.offset}, "
            f"key {message.message_key}, id {message.message_id}"
        )


def roll_back_an_order(run: Run) -> None:
    run.heading("2. An error later in the same transaction rolls back the order and its message")
    orders_before, messages_before = Order.objects.count(), _log_count()
    try:
        with transaction.atomic():
            place_order("mallory", Decimal("13.00"))
            raise PaymentDeclined("card declined")
    except PaymentDeclined as exc:
        run.say(f"place_order('mallory', 13.00), then PaymentDeclined({str(exc)!r}): rolled back")
    run.say(
        f"orders {orders_before} -> {Order.objects.count()}, "
        f"messages {messages_before} -> {_log_count()}: neither the order nor its message exists"
    )


def publish_a_duplicate(run: Run) -> None:
    run.heading("3. Publishing an id that is already in the log is a no-op")
    order = run.orders[0]
    original = _message_of(order)
    messages_before = _log_count()
    again = sqlqueue.publish(
        TOPIC,
        {"order_id": order.pk, "customer": order.customer, "total": str(order.total)},
        key=f"customer-{order.customer}",
        id=f"order-{order.pk}-placed",
    )
    run.say(
        f"id {again.id} again -> offset {again.offset} (first publish: offset "
        f"{original.offset}); messages {messages_before} -> {_log_count()}"
    )


def publish_in_bulk(run: Run) -> None:
    run.heading("4. publish_many: five orders, their messages in one call")
    orders = place_orders_in_bulk(
        [("carol", Decimal("7.25")), ("dave", Decimal("99.00")), ("carol", Decimal("3.10")),
         ("erin", Decimal("12.00")), ("bob", Decimal("64.90"))]
    )
    run.orders += orders
    offsets = [str(_message_of(order).offset) for order in orders]
    run.say(f"orders #{orders[0].pk}-#{orders[-1].pk} -> offsets {', '.join(offsets)}")


def publish_a_delayed_message(run: Run) -> None:
    run.heading(f"5. A message delayed by {REMINDER_DELAY} s")
    order = run.orders[0]
    message = sqlqueue.publish(
        REMINDER_TOPIC,
        {"order_id": order.pk, "action": "ask for a review"},
        key=f"customer-{order.customer}",
        id=f"review-{order.pk}-{run.id}",
        delay=REMINDER_DELAY,
    )
    run.say(
        f"offset {message.offset}: published {_clock(message.published_at)}, "
        f"deliver_at {_clock(message.deliver_at)} (database clock)"
    )
    run.say("it is sequenced like any other message; workers only hand it out once it is due")


def sequence_the_log(run: Run) -> None:
    run.heading("6. The sequencer gives committed messages their consumable positions")
    waiting = QueueMessage.objects.filter(position__isnull=True).count()
    sequenced = sequence_all(sequenced_by="demo")
    run.say(f"{waiting} message(s) had no position; sequence_all() positioned {sequenced}")
    run.say("workers read each partition in position order, never by offset")


def show_the_log(run: Run) -> None:
    run.heading("7. This run's messages in the log")
    rows = (
        QueueMessage.objects.filter(offset__gt=run.first_offset)
        .order_by("offset")
        .values_list("topic", "message_key", "partition_key", "message_id", "offset", "position")
    )
    _table(run, ["topic", "key", "partition", "id", "offset", "position"], list(rows))
    offsets = {row[4] for row in rows}
    last = max(offsets, default=run.first_offset)
    unused = [str(o) for o in range(run.first_offset + 1, last) if o not in offsets]
    if unused:
        run.say(
            f"offset(s) {', '.join(unused)} unused: a duplicate publish or a rolled-back "
            "transaction can use one up."
        )
    run.say("Positions are only given to committed messages, so they have no gaps.")


def start_two_workers(run: Run) -> None:
    run.heading("8. Two workers consume the orders: groups billing and emails, independently")
    # In the project's directory (make clean removes it), never the system's temp directory.
    run.worker_logs = DEMO_LOGS / run.id
    run.worker_logs.mkdir(parents=True, exist_ok=True)
    for name in WORKERS:
        log = (run.worker_logs / f"{name}.log").open("wb")
        run.workers[name] = subprocess.Popen(  # noqa: S603 - this interpreter, fixed arguments
            [sys.executable, str(MANAGE_PY), "runqueueworker", "--name", name],
            stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy(),
        )
    logs = os.path.relpath(run.worker_logs)
    run.say(f"started {', '.join(WORKERS)} (manage.py runqueueworker; logs in {logs})")
    _wait_for_rebalance(run)
    run.say("both hold a fair share of the partitions; placing six more orders and a poison one")
    run.orders += [place_order(customer, Decimal(total)) for customer, total in [
        ("frank", "8.00"), ("grace", "15.50"), ("heidi", "23.00"), ("ivan", "4.75"),
        ("judy", "31.00"), ("alice", "9.99"),
    ]]
    run.poison = place_order("mallory", Decimal("-5.00"))
    run.say(f"order #{run.poison.pk} has a negative total: billing's handler will always fail")
    order_ids = [order.pk for order in run.orders]
    deadline = time.monotonic() + CONSUME_TIMEOUT
    while time.monotonic() < deadline:
        billed = set(HandlerRun.objects.filter(group="billing", succeeded=True,
                                               order__in=order_ids).values_list("order", flat=True))
        mailed = set(HandlerRun.objects.filter(group="emails", order__in=order_ids + [run.poison.pk])
                     .values_list("order", flat=True))
        dead = QueueMessage.objects.filter(topic=f"{TOPIC}_dlq", consumer_group="billing",
                                           original_offset=_message_of(run.poison).offset)
        if len(billed) == len(order_ids) and len(mailed) == len(order_ids) + 1 and dead.exists():
            break
        _check_workers_alive(run)
        time.sleep(0.2)
    else:
        raise CommandError(f"the workers did not finish within {CONSUME_TIMEOUT:.0f} s; see the "
                           f"logs in {run.worker_logs}")
    pids = {process.pid: name for name, process in run.workers.items()}
    rows = []
    moved: list[str] = []
    for group in ("billing", "emails"):
        runs = HandlerRun.objects.filter(group=group, order__in=_order_ids(run)).order_by("pk")
        first_worker: dict[str, str] = {}  # key -> the worker that handled it first
        keys_of: dict[str, set[str]] = {name: set() for name in pids.values()}
        for pid, customer in runs.values_list("worker_pid", "order__customer"):
            key = f"customer-{customer}"
            first_worker.setdefault(key, pids[pid])
            keys_of[pids[pid]].add(key)
        for pid, name in pids.items():
            mine = runs.filter(worker_pid=pid)
            rows.append((group, name, str(mine.filter(succeeded=True).count()),
                         str(mine.filter(succeeded=False).count()),
                         ", ".join(sorted(keys_of[name])) or "-"))
        moved += [f"{key} in {group} (first {worker})" for key, worker in first_worker.items()
                  if sum(key in keys for keys in keys_of.values()) > 1]
    _table(run, ["group", "worker", "handled", "failed", "keys"], rows)
    run.say("each partition is leased to one worker per group, and a key always maps to the same "
            "partition; both groups saw every order")
    if moved:
        run.say(f"under both workers: {', '.join(sorted(moved))}. The first worker to start "
                "leased every partition and handled the early orders; when the second one "
                "joined, the partitions were shared out and that key's partition moved to it. "
                "One worker at a time holds a partition, so the key's order held across the move")


def show_the_dead_letter(run: Run) -> None:
    run.heading("9. The poison order lands in billing's dead-letter topic, and only there")
    if run.poison is None:
        raise RuntimeError("the poison order is placed by step 7, before this step")
    original = _message_of(run.poison)
    attempts = HandlerRun.objects.filter(group="billing", order=run.poison).count()
    copy = QueueMessage.objects.get(topic=f"{TOPIC}_dlq", consumer_group="billing",
                                    original_offset=original.offset)
    run.say(f"billing tried order #{run.poison.pk} {attempts} times (max_attempts=3), then gave up")
    run.say(f"{copy.topic}: id {copy.message_id}, group {copy.consumer_group}, "
            f"attempts {copy.failure_count}, error {copy.last_error!r}")
    emails = HandlerRun.objects.filter(group="emails", order=run.poison).count()
    others = QueueMessage.objects.filter(topic=f"{TOPIC}_dlq", original_offset=original.offset)
    run.say(f"emails handled the same message {emails} time(s) without error; dead letters for "
            f"it: {others.count()} (billing's only); the original stays in {TOPIC!r} for GC")


def run_a_task(run: Run) -> None:
    run.heading("10. A Django task, enqueued with an order and run by the same workers")
    from shop.tasks import send_receipt

    if send_receipt is None:
        run.say("skipped: this Django has no Tasks framework (Django 5.2 needs django-tasks)")
        return
    with transaction.atomic():
        order = place_order("oscar", Decimal("12.00"))
        result = send_receipt.enqueue(order.pk)
    run.say(f"order #{order.pk} and task {result.id} committed together; status {result.status}")
    deadline = time.monotonic() + CONSUME_TIMEOUT
    while not result.is_finished:
        if time.monotonic() > deadline:
            raise CommandError(f"the task did not finish within {CONSUME_TIMEOUT:.0f} s; see "
                               f"the logs in {run.worker_logs}")
        _check_workers_alive(run)
        time.sleep(0.1)
        result.refresh()
    run.say(f"{result.status} on {', '.join(result.worker_ids)}: {result.return_value!r}")


def fire_a_schedule(run: Run) -> None:
    run.heading("11. A schedule from settings fires once per tick, though both workers run it")
    from shop.tasks import sales_report

    if sales_report is None:
        run.say("skipped: this Django has no Tasks framework (Django 5.2 needs django-tasks)")
        return
    schedule = Schedule.objects.get(name=SCHEDULE)
    run.say(f"{SCHEDULE!r}: cron {schedule.cron!r}, {schedule.target}; every worker's scheduler "
            "looks at it, the first to lock it fires it")
    since = schedule.last_run_at or 0
    deadline = time.monotonic() + CONSUME_TIMEOUT
    while (schedule.last_run_at or 0) <= since:
        if time.monotonic() > deadline:
            raise CommandError(f"the schedule did not fire within {CONSUME_TIMEOUT:.0f} s; see "
                               f"the logs in {run.worker_logs}")
        _check_workers_alive(run)
        time.sleep(0.1)
        schedule.refresh_from_db()
    result = sales_report.get_result(schedule.last_message)
    while not result.is_finished and time.monotonic() < deadline:
        time.sleep(0.1)
        result.refresh()
    messages = QueueMessage.objects.filter(message_id=schedule.last_message).count()
    run.say(f"tick {_clock(datetime.fromtimestamp(schedule.last_run_at / 1000, UTC))}: "
            f"{messages} message, id {schedule.last_message}")
    run.say(f"the task ran {len(result.worker_ids)} time(s), on {', '.join(result.worker_ids)}: "
            f"{result.return_value!r}")


def stop_the_workers(run: Run) -> None:
    run.heading("12. SIGTERM: the workers finish in-flight messages, release leases and exit")
    for process in run.workers.values():
        process.send_signal(signal.SIGTERM)
    codes = {name: process.wait(timeout=60) for name, process in run.workers.items()}
    run.say(", ".join(f"{name} exited {code}" for name, code in codes.items()))
    held = PartitionLease.objects.filter(leased_by__in=WORKERS).count()
    live = SubscriberHeartbeat.objects.filter(subscriber_name__in=WORKERS,
                                              deregistered_at=0).count()
    run.say(f"leases still held by them: {held}; registered heartbeats still live: {live}")
    if any(codes.values()):
        raise CommandError(f"a worker exited with an error; see the logs in {run.worker_logs}")


STEPS: Sequence[Callable[[Run], None]] = (
    place_three_orders,
    roll_back_an_order,
    publish_a_duplicate,
    publish_in_bulk,
    publish_a_delayed_message,
    sequence_the_log,
    show_the_log,
    start_two_workers,
    show_the_dead_letter,
    run_a_task,
    fire_a_schedule,
    stop_the_workers,
)


# --------------------------------------------------------------------------- helpers


def _wait_for_rebalance(run: Run) -> None:
    """Wait until each worker holds billing partitions (first-come takes all, then shares)."""
    deadline = time.monotonic() + CONSUME_TIMEOUT
    while time.monotonic() < deadline:
        holders = set(PartitionLease.objects.filter(consumer_group="billing", topic=TOPIC,
                                                    leased_by__in=WORKERS)
                      .values_list("leased_by", flat=True))
        if len(holders) == len(WORKERS):
            return
        _check_workers_alive(run)
        time.sleep(0.2)
    raise CommandError(f"the workers did not share partitions within {CONSUME_TIMEOUT:.0f} s")


def _order_ids(run: Run) -> list[int]:
    """This run's orders, the poison one included."""
    return [order.pk for order in run.orders] + ([run.poison.pk] if run.poison else [])


def _summary(run: Run) -> None:
    ids = _order_ids(run)
    published = QueueMessage.objects.filter(offset__gt=run.first_offset).exclude(
        topic__endswith="_dlq").count()
    billed = HandlerRun.objects.filter(group="billing", succeeded=True, order__in=ids).count()
    mailed = HandlerRun.objects.filter(group="emails", succeeded=True, order__in=ids).count()
    dead = QueueMessage.objects.filter(offset__gt=run.first_offset, topic__endswith="_dlq").count()
    run.stdout.write(
        f"Summary: {published} messages published, billing handled {billed}, emails handled "
        f"{mailed}, {dead} dead letter(s), {len(run.workers)} workers stopped cleanly."
    )


def _check_workers_alive(run: Run) -> None:
    for name, process in run.workers.items():
        if process.poll() is not None:
            raise CommandError(f"{name} exited early with status {process.returncode}; see "
                               f"{run.worker_logs}")


def _message_of(order: Order) -> QueueMessage:
    return QueueMessage.objects.get(topic=TOPIC, message_id=f"order-{order.pk}-placed")


def _log_count() -> int:
    return QueueMessage.objects.filter(topic=TOPIC).count()


def _clock(moment: datetime) -> str:
    return moment.strftime("%H:%M:%S.%f")[:-3] + " UTC"


def _table(run: Run, headers: list[str], rows: list[tuple[Any, ...]]) -> None:
    cells = [headers] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        line = "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True))
        run.say(line.rstrip())


class Command(BaseCommand):
    help = "Publish some orders through django-sqlqueue and print what happened at each step."

    def handle(self, *args: Any, **options: Any) -> None:
        first_offset = QueueMessage.objects.aggregate(last=Max("offset"))["last"] or 0
        run = Run(
            id=timezone.now().strftime("%Y%m%d-%H%M%S-%f"),
            stdout=self.stdout,
            style=self.style,
            first_offset=first_offset,
        )
        self.stdout.write(
            f"django-sqlqueue demo, run {run.id}, on {connection.vendor} "
            f"({connection.settings_dict['NAME']})"
        )
        try:
            for step in STEPS:
                step(run)
        finally:
            for process in run.workers.values():
                if process.poll() is None:
                    process.kill()
        self.stdout.write("")
        _summary(run)
        username, password = ensure_superuser()
        self.stdout.write(self.style.SUCCESS("Done."))
        self.stdout.write(
            f"See the queue in Django's admin: run `make admin`, open {ADMIN_URL} and log in as "
            f"{username} / {password}.")
