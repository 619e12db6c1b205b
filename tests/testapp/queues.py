"""Handlers for the worker tests: each records its run in the Handled table."""

from __future__ import annotations

import os
import time

import django_sqlqueue as sqlqueue

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
