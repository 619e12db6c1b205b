"""Handlers for the worker tests: each records its run in the Handled table."""

from __future__ import annotations

import os
import time

import django_sqlqueue as sqlqueue
from django_sqlqueue import signals

from .models import Handled

FAST_RETRY = sqlqueue.ExponentialBackoff(base=0.05, cap=0.2)


def record(message: sqlqueue.Message) -> None:
    Handled.objects.create(
        group=message.group, topic=message.topic, key=message.key, offset=message.offset,
        message_id=message.id, payload=message.payload, attempt=message.attempt,
        pid=os.getpid(), handled_at=time.time(),
    )


@sqlqueue.subscriber("orders", group="billing", backoff=FAST_RETRY)
@sqlqueue.subscriber("orders", group="shipping", backoff=FAST_RETRY)
def handle_order(message: sqlqueue.Message) -> None:
    record(message)
    if isinstance(message.payload, dict) and message.payload.get("fail_for") == message.group:
        raise RuntimeError(f"cannot handle order for {message.group}")


@sqlqueue.subscriber("poison", group="billing", max_attempts=3, backoff=FAST_RETRY)
def always_fails(message: sqlqueue.Message) -> None:
    record(message)
    raise ValueError("poison message")


@sqlqueue.subscriber("slow", group="billing", visibility_timeout=2, backoff=FAST_RETRY)
def slow(message: sqlqueue.Message) -> None:
    record(message)
    time.sleep(float(message.payload.get("sleep", 0)))


@sqlqueue.subscriber("strict", group="ordered", batch_size=1, backoff=FAST_RETRY)
def strictly_ordered(message: sqlqueue.Message) -> None:
    record(message)
    time.sleep(0.002)


@sqlqueue.subscriber("doomed", group="billing", max_attempts=2, backoff=FAST_RETRY)
@sqlqueue.subscriber("doomed", group="shipping", max_attempts=2, backoff=FAST_RETRY)
def always_doomed(message: sqlqueue.Message) -> None:
    record(message)
    raise RuntimeError(f"doomed for {message.group}")


@sqlqueue.subscriber("retried", group="billing", backoff=FAST_RETRY)
def retried_once(message: sqlqueue.Message) -> None:
    """Asks for a retry after payload["retry_in"] seconds on the first attempt only."""
    record(message)
    if message.attempt == 1:
        raise sqlqueue.Retry(delay=float(message.payload["retry_in"]), reason="not yet")


@sqlqueue.subscriber("unextended", group="billing", visibility_timeout=1, auto_extend=False,
                     backoff=FAST_RETRY)
def slow_without_extension(message: sqlqueue.Message) -> None:
    record(message)
    time.sleep(float(message.payload.get("sleep", 0)))


@sqlqueue.subscriber("extender", group="billing", visibility_timeout=1, auto_extend=False,
                     backoff=FAST_RETRY)
def extends_its_own_visibility(message: sqlqueue.Message) -> None:
    record(message)
    message.extend_visibility(float(message.payload["extend"]))
    time.sleep(float(message.payload.get("sleep", 0)))


@sqlqueue.subscriber("keyed", group="ordered", batch_size=1, backoff=FAST_RETRY)
def strictly_ordered_per_key(message: sqlqueue.Message) -> None:
    """Fails its first payload["fail_attempts"] attempts, retrying after payload["retry_in"]."""
    record(message)
    if message.attempt <= int(message.payload.get("fail_attempts", 0)):
        raise sqlqueue.Retry(delay=float(message.payload["retry_in"]), reason="not yet")


@sqlqueue.subscriber("spread", group="pool", backoff=FAST_RETRY)
def shared_keyless(message: sqlqueue.Message) -> None:
    record(message)
    time.sleep(0.005)


@sqlqueue.subscriber("manykeys", group="bulk", backoff=FAST_RETRY)
def one_of_many_keys(message: sqlqueue.Message) -> None:
    record(message)


# ------------------------------------------------------------------ hostile handlers
# Each makes one message do something that once stalled a whole worker; the tests check
# that the worker's other keys and partitions carry on.


class NotANumberBackoff:
    """A custom backoff gone wrong: it returns NaN, or raises, instead of seconds."""

    def delay(self, attempt: int) -> float:
        if attempt == 1:
            return float("nan")
        raise RuntimeError("backoff broke")


@sqlqueue.subscriber("hostile", group="billing", max_attempts=3, backoff=FAST_RETRY)
def hostile(message: sqlqueue.Message) -> None:
    """payload {"retry_delay": x} asks for a retry after float(x) seconds; {"error": text}
    fails with that text; anything else is handled normally."""
    record(message)
    payload = message.payload if isinstance(message.payload, dict) else {}
    if "retry_delay" in payload:
        raise sqlqueue.Retry(delay=float(payload["retry_delay"]), reason="hostile retry")
    if "error" in payload:
        text = payload["error"].replace("<NUL>", "\x00").replace("<SURROGATE>", "\udc80")
        raise RuntimeError(text)


@sqlqueue.subscriber("badbackoff", group="billing", max_attempts=3, backoff=NotANumberBackoff())
def fails_with_a_broken_backoff(message: sqlqueue.Message) -> None:
    record(message)
    if isinstance(message.payload, dict) and message.payload.get("fail"):
        raise RuntimeError("fails, and its backoff cannot say when to retry")


def _explode(sender: object, message: sqlqueue.Message, **kwargs: object) -> None:
    if message.topic == "loud":
        raise RuntimeError(f"a receiver of a signal for offset {message.offset} failed")


for _signal in (signals.message_delivered, signals.message_acked,
                signals.message_nacked, signals.message_dead_lettered):
    _signal.connect(_explode, dispatch_uid=f"tests-explode-{_signal!r}")


@sqlqueue.subscriber("loud", group="billing", max_attempts=2, backoff=FAST_RETRY)
def handled_despite_raising_receivers(message: sqlqueue.Message) -> None:
    record(message)
    if isinstance(message.payload, dict) and message.payload.get("fail"):
        raise RuntimeError("fails, so nack and dead-letter signals are sent too")


@sqlqueue.subscriber("txextend", group="billing", visibility_timeout=2, backoff=FAST_RETRY)
def extends_inside_its_own_transaction(message: sqlqueue.Message) -> None:
    """Holds a transaction of its own open for payload["hold"] seconds, extending its
    visibility by payload["extend"] seconds from inside it."""
    from django.db import transaction

    with transaction.atomic():
        record(message)
        if isinstance(message.payload, dict) and message.payload.get("hold"):
            message.extend_visibility(float(message.payload["extend"]))
            time.sleep(float(message.payload["hold"]))


@sqlqueue.subscriber("latefail", group="billing", max_attempts=2, visibility_timeout=1,
                     auto_extend=False, backoff=FAST_RETRY)
def fails_late_on_its_first_attempt(message: sqlqueue.Message) -> None:
    """Attempt 1 outlives its visibility and then dead-letters itself; attempt 2 succeeds."""
    record(message)
    if message.attempt == 1:
        time.sleep(1.6)
        raise sqlqueue.DeadLetter("too late")


@sqlqueue.subscriber("poison_dlq", group="triage")
def triage(message: sqlqueue.Message) -> None:
    """Records what a dead-letter handler learns about each dead letter."""
    import dataclasses

    info = message.dead_letter
    Handled.objects.create(
        group=message.group, topic=message.topic, key=message.key, offset=message.offset,
        message_id=message.id, payload=dataclasses.asdict(info) if info else None,
        attempt=message.attempt, pid=os.getpid(), handled_at=time.time(),
    )


@sqlqueue.subscriber("vanishing", group="billing")
def collected_under_its_feet(message: sqlqueue.Message) -> None:
    """Its log row disappears while it runs (as when GC collects it for a group that
    registered late), then it is dead-lettered."""
    from django_sqlqueue.models import QueueMessage

    record(message)
    QueueMessage.objects.filter(offset=message.offset).delete()
    raise sqlqueue.DeadLetter("gone")


@sqlqueue.subscriber("stuck", group="billing", backoff=FAST_RETRY)
def hangs_on_its_first_attempt(message: sqlqueue.Message) -> None:
    """Hangs for payload["hang"] seconds on the first attempt; later attempts return."""
    record(message)
    if message.attempt == 1:
        time.sleep(float(message.payload.get("hang", 0)))


# ------------------------------------------------------------------ handlers that misbehave
# towards the worker itself: a return value, their own database connection.


@sqlqueue.subscriber("returning", group="billing", backoff=FAST_RETRY)
def returns_a_value(message: sqlqueue.Message) -> object:
    """Returns payload["return"], which is not None: the message is still acked."""
    record(message)
    return message.payload["return"]


def _end_own_session() -> None:
    """End this thread's database session the way an operator (or a failover) would: KILL
    on MariaDB/MySQL, pg_terminate_backend on PostgreSQL. On SQLite, which has no server,
    close the file handle under Django. Django is not told; its next use of the
    connection fails."""
    from django.db import DatabaseError, connection

    if connection.vendor == "sqlite":
        connection.ensure_connection()
        connection.connection.close()
        return
    with connection.cursor() as cursor:
        try:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            else:
                cursor.execute("SELECT CONNECTION_ID()")
                cursor.execute(f"KILL {int(cursor.fetchone()[0])}")
        except DatabaseError:
            pass  # the statement that ends the session fails with it


@sqlqueue.subscriber("severed", group="billing", backoff=FAST_RETRY)
def severs_its_own_connection(message: sqlqueue.Message) -> None:
    """payload["mode"]: "close" closes the connection and goes on (Django reconnects);
    "kill" ends the session on the first attempt and then uses it (so that attempt fails);
    "kill-and-return" records, ends the session and returns; anything else just records."""
    from django.db import connection

    mode = message.payload.get("mode") if isinstance(message.payload, dict) else None
    if mode == "close":
        connection.close()
        record(message)
    elif mode == "kill" and message.attempt == 1:
        _end_own_session()
        record(message)  # fails: the session is gone
    elif mode == "kill-and-return":
        record(message)
        _end_own_session()
    else:
        record(message)


@sqlqueue.subscriber("forged", group="billing", max_attempts=1, backoff=FAST_RETRY)
def fails_with_a_line_break(message: sqlqueue.Message) -> None:
    """Fails with an error text that would start a log line of its own, unescaped."""
    record(message)
    raise RuntimeError(f"no such order\n{message.payload['forged']}\x1b[2J")


# ------------------------------------------------------------------ operating


@sqlqueue.subscriber("fixable", group="billing", max_attempts=2, backoff=FAST_RETRY)
@sqlqueue.subscriber("fixable", group="shipping", max_attempts=2, backoff=FAST_RETRY)
def fixable(message: sqlqueue.Message) -> None:
    """Fails for billing while the file payload["fail_while"] exists: the handler an
    operator fixes before replaying its dead letters."""
    record(message)
    if message.group == "billing" and os.path.exists(message.payload["fail_while"]):
        raise RuntimeError(f"billing is broken for {message.payload.get('customer_id')}")


@sqlqueue.subscriber("pausable", group="billing", batch_size=1, backoff=FAST_RETRY)
def pausable(message: sqlqueue.Message) -> None:
    """Strictly ordered; sleeps payload["sleep"] seconds."""
    record(message)
    time.sleep(float(message.payload.get("sleep", 0)))


# Failing long enough (four attempts over about 3 s) for an operator to see it in the admin.
PATIENT_RETRY = sqlqueue.ExponentialBackoff(base=1.0, cap=2.0, jitter=False)


@sqlqueue.subscriber("checkout", group="payments", batch_size=1, max_attempts=3,
                     backoff=PATIENT_RETRY)
@sqlqueue.subscriber("checkout", group="emails", backoff=FAST_RETRY)
def checkout(message: sqlqueue.Message) -> None:
    """The payments group fails while the file named by payload["broken_while"] exists:
    deleting it is the fix being deployed. The emails group always succeeds."""
    record(message)
    broken = message.payload.get("broken_while") if isinstance(message.payload, dict) else None
    if message.group == "payments" and broken and os.path.exists(broken):
        raise RuntimeError(
            f"payment provider refused customer {message.payload.get('customer_id')}")


# ------------------------------------------------------------------ written by Spark


@sqlqueue.subscriber("sparkfed", group="downstream", backoff=FAST_RETRY)
def fed_by_spark(message: sqlqueue.Message) -> None:
    """Records the payload with the headers, as they arrive, in Handled.payload."""
    Handled.objects.create(
        group=message.group, topic=message.topic, key=message.key, offset=message.offset,
        message_id=message.id, payload={"payload": message.payload, "headers": message.headers},
        attempt=message.attempt, pid=os.getpid(), handled_at=time.time(),
    )


# ------------------------------------------------------------------ fleet-wide limits
# Each run appends "start end pid key offset attempt" to the file payload["log"] names
# (one small O_APPEND write per run, whole lines from every worker process), so a test
# measures how many ran at once and how often they started.


def _log_run(message: sqlqueue.Message) -> None:
    started = time.time()
    sleep = message.payload.get("sleep_first") if message.attempt == 1 else None
    time.sleep(float(sleep if sleep is not None else message.payload.get("sleep", 0)))
    line = (f"{started:.6f} {time.time():.6f} {os.getpid()} {message.key or '-'} "
            f"{message.offset} {message.attempt}\n")
    fd = os.open(message.payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@sqlqueue.subscriber("capped", group="limits", max_running=3, backoff=FAST_RETRY)
def capped(message: sqlqueue.Message) -> None:
    _log_run(message)


@sqlqueue.subscriber("capped-one", group="limits", max_running=1, backoff=FAST_RETRY)
def capped_to_one(message: sqlqueue.Message) -> None:
    _log_run(message)


@sqlqueue.subscriber("capped-keys", group="limits", max_running_per_key=2, backoff=FAST_RETRY)
def capped_per_key(message: sqlqueue.Message) -> None:
    _log_run(message)


@sqlqueue.subscriber("capped-strict", group="limits", batch_size=1, max_running=2,
                     backoff=FAST_RETRY)
def capped_in_order(message: sqlqueue.Message) -> None:
    _log_run(message)


@sqlqueue.subscriber("paced", group="limits", rate="20/s", backoff=FAST_RETRY)
def paced(message: sqlqueue.Message) -> None:
    _log_run(message)


@sqlqueue.subscriber("unlimited", group="limits", backoff=FAST_RETRY)
def unlimited(message: sqlqueue.Message) -> None:
    _log_run(message)


@sqlqueue.subscriber("paced-keys", group="limits", rate_per_key="10/s", backoff=FAST_RETRY)
def paced_per_key(message: sqlqueue.Message) -> None:
    _log_run(message)


# ------------------------------------------------------------------ cancelled messages


@sqlqueue.subscriber("cancels", group="alpha", backoff=FAST_RETRY)
@sqlqueue.subscriber("cancels", group="beta", backoff=FAST_RETRY)
@sqlqueue.subscriber("cancels", group="gamma", batch_size=1, backoff=FAST_RETRY)
def cancellable(message: sqlqueue.Message) -> None:
    """Records its start (topic "cancels") and its end (topic "cancels.end"): a message
    either runs to its end or never starts. Group "gamma" runs in strict mode. payload:
    "sleep" seconds between the two, "retry_in" seconds before a second attempt (asked
    for on the first)."""
    record(message)
    payload = message.payload if isinstance(message.payload, dict) else {}
    if message.attempt == 1 and payload.get("retry_in") is not None:
        raise sqlqueue.Retry(delay=float(payload["retry_in"]))
    time.sleep(float(payload.get("sleep", 0)))
    Handled.objects.create(
        group=message.group, topic="cancels.end", key=message.key, offset=message.offset,
        message_id=message.id, payload=message.payload, attempt=message.attempt,
        pid=os.getpid(), handled_at=time.time(),
    )
