"""The consumer API in process: @subscriber validation, Message, Retry. No database needed."""

from __future__ import annotations

import gc
import logging
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.test import override_settings

import django_sqlqueue as sqlqueue
from django_sqlqueue.consuming.registry import Subscription, subscriptions, unregister

# Topics no queues.py module subscribes to, so registrations here collide with nothing.
TOPIC = "api-test"
OTHER_TOPIC = "api-test-other"


@pytest.fixture(autouse=True)
def forget_test_subscriptions() -> Iterator[None]:
    yield
    for subscription in subscriptions():
        if subscription.topic in {TOPIC, OTHER_TOPIC}:
            unregister(subscription.topic, subscription.group)


def handler(message: sqlqueue.Message) -> None:
    pass


def other_handler(message: sqlqueue.Message) -> None:
    pass


def registered() -> dict[tuple[str, str], Subscription]:
    return {(s.topic, s.group): s for s in subscriptions() if s.topic in {TOPIC, OTHER_TOPIC}}


# --------------------------------------------------------------------------- @subscriber


@pytest.mark.parametrize(
    ("topic", "group", "options", "names"),
    [
        ("", "g", {}, ["topic", "empty"]),
        ("has space", "g", {}, ["topic", "has space"]),
        ("t" * 201, "g", {}, ["topic", "201", "200"]),
        (42, "g", {}, ["topic", "str"]),
        (TOPIC, "", {}, ["group", "''"]),
        (TOPIC, "bad group", {}, ["group", "'bad group'"]),
        (TOPIC, "__internal", {}, ["group", "'__internal'", "__"]),
        (TOPIC, "g" * 101, {}, ["group", "100"]),
        (TOPIC, "g", {"max_attempts": 0}, ["max_attempts", "0"]),
        (TOPIC, "g", {"max_attempts": 1.5}, ["max_attempts", "1.5"]),
        (TOPIC, "g", {"batch_size": 0}, ["batch_size", "0"]),
        (TOPIC, "g", {"batch_size": True}, ["batch_size", "True"]),
        (TOPIC, "g", {"visibility_timeout": 0}, ["visibility_timeout", "0"]),
        (TOPIC, "g", {"visibility_timeout": -1.0}, ["visibility_timeout", "-1.0"]),
        (TOPIC, "g", {"backoff": 5}, ["backoff", "delay"]),
        (TOPIC, "billing\n", {}, ["group", "'billing\\n'"]),
        (TOPIC, "g", {"visibility_timeout": float("nan")}, ["visibility_timeout", "nan"]),
        (TOPIC, "g", {"visibility_timeout": float("inf")}, ["visibility_timeout", "inf"]),
        (TOPIC, "g", {"visibility_timeout": 1e300}, ["visibility_timeout", "a year"]),
    ],
    ids=[
        "empty-topic", "topic-with-space", "long-topic", "topic-not-str", "empty-group",
        "group-with-space", "reserved-group", "long-group", "max_attempts-0",
        "max_attempts-float", "batch_size-0", "batch_size-bool", "visibility_timeout-0",
        "visibility_timeout-negative", "backoff-without-delay", "group-with-line-break",
        "visibility_timeout-nan", "visibility_timeout-infinite", "visibility_timeout-huge",
    ],
)
def test_subscriber_rejects_a_bad_option_naming_it(topic, group, options, names):
    with pytest.raises(sqlqueue.ConfigurationError) as caught:
        sqlqueue.subscriber(topic, group=group, **options)

    for name in names:
        assert name in str(caught.value)
    assert registered() == {}


def test_subscriber_rejects_something_that_is_not_callable():
    with pytest.raises(sqlqueue.ConfigurationError, match="callable"):
        sqlqueue.subscriber(TOPIC, group="g")("not a function")

    assert registered() == {}


def test_configuration_error_is_a_value_error_and_a_queue_error():
    with pytest.raises(ValueError):
        sqlqueue.subscriber(TOPIC, group="g", batch_size=0)
    with pytest.raises(sqlqueue.SQLQueueError):
        sqlqueue.subscriber(TOPIC, group="g", batch_size=0)


def test_the_same_function_may_handle_two_topic_group_pairs():
    decorated = sqlqueue.subscriber(TOPIC, group="a")(sqlqueue.subscriber(OTHER_TOPIC, group="b")(
        handler))

    assert decorated is handler
    subs = registered()
    assert set(subs) == {(TOPIC, "a"), (OTHER_TOPIC, "b")}
    assert all(s.function is handler for s in subs.values())


def test_one_function_may_serve_two_groups_of_one_topic():
    sqlqueue.subscriber(TOPIC, group="a")(handler)
    sqlqueue.subscriber(TOPIC, group="b")(handler)

    assert set(registered()) == {(TOPIC, "a"), (TOPIC, "b")}


def test_a_group_has_one_handler_per_topic():
    sqlqueue.subscriber(TOPIC, group="a")(handler)

    with pytest.raises(sqlqueue.ConfigurationError) as caught:
        sqlqueue.subscriber(TOPIC, group="a")(other_handler)

    assert "'a'" in str(caught.value) and repr(TOPIC) in str(caught.value)
    assert registered()[(TOPIC, "a")].function is handler


def test_registering_the_same_function_again_is_harmless():
    sqlqueue.subscriber(TOPIC, group="a", max_attempts=2)(handler)
    sqlqueue.subscriber(TOPIC, group="a", max_attempts=7)(handler)

    assert registered()[(TOPIC, "a")].max_attempts == 7


def test_unset_options_come_from_the_sqlqueue_setting():
    overrides = {"MAX_ATTEMPTS": 9, "VISIBILITY_TIMEOUT": 12, "BATCH_SIZE": 3}
    with override_settings(SQLQUEUE=overrides):
        sqlqueue.subscriber(TOPIC, group="a")(handler)
        sqlqueue.subscriber(TOPIC, group="b", max_attempts=2, visibility_timeout=1.5,
                            batch_size=1)(handler)

    a, b = registered()[(TOPIC, "a")], registered()[(TOPIC, "b")]
    assert (a.max_attempts, a.visibility_timeout, a.batch_size, a.strict) == (
        9, 12.0, 3, False)
    assert (b.max_attempts, b.visibility_timeout, b.batch_size, b.strict) == (
        2, 1.5, 1, True)


def test_unregister_forgets_a_subscription_and_ignores_unknown_ones():
    sqlqueue.subscriber(TOPIC, group="a")(handler)

    unregister(TOPIC, "a")
    unregister(TOPIC, "never-registered")

    assert registered() == {}


# --------------------------------------------------------------------------- Message, Retry


def a_message() -> sqlqueue.Message:
    return sqlqueue.Message(
        topic=TOPIC, key="k", id="m-1", offset=1, payload={}, headers={},
        published_at=datetime(2024, 1, 1, tzinfo=UTC), attempt=1, group="a",
    )


@pytest.mark.parametrize("seconds", [0, -1, 0.0, True, "5", None, float("nan"), float("inf"), 1e300])
def test_extend_visibility_needs_positive_seconds(seconds):
    with pytest.raises(ValueError, match="seconds > 0"):
        a_message().extend_visibility(seconds)


def test_extend_visibility_outside_a_worker_says_so():
    with pytest.raises(RuntimeError, match="not delivered by a worker"):
        a_message().extend_visibility(5)


@pytest.mark.parametrize("delay", [-1, -0.001])
def test_retry_rejects_a_negative_delay(delay):
    with pytest.raises(ValueError, match="delay"):
        sqlqueue.Retry(delay=delay)


def test_retry_keeps_its_delay_and_reason():
    assert (sqlqueue.Retry().delay, sqlqueue.Retry(delay=0).delay) == (None, 0)
    retry = sqlqueue.Retry(delay=2.5, reason="rate limited")
    assert (retry.delay, retry.reason, str(retry)) == (2.5, "rate limited", "rate limited")


# --------------------------------------------------------------------------- what a handler returns


def test_an_async_handler_is_refused_when_it_is_registered():
    async def handle(message: sqlqueue.Message) -> None:
        pass

    with pytest.raises(sqlqueue.ConfigurationError, match="async function.*never awaited"):
        sqlqueue.subscriber(TOPIC, group="a")(handle)
    assert registered() == {}


def test_a_returned_value_is_ignored_with_one_warning_per_subscription(caplog):
    def returns_true(message: sqlqueue.Message) -> bool:
        return True

    sqlqueue.subscriber(TOPIC, group="a")(returns_true)
    run = registered()[(TOPIC, "a")].handler

    with caplog.at_level(logging.WARNING, logger="django_sqlqueue.worker"):
        assert run(a_message()) is None
        assert run(a_message()) is None

    [record] = [r for r in caplog.records if "returned a value" in r.getMessage()]
    assert f"topic={TOPIC} group=a" in record.getMessage()
    assert "returns_true" in record.getMessage() and "type=bool" in record.getMessage()


def test_a_returned_coroutine_fails_the_message_and_is_closed_unawaited():
    async def work() -> None:
        raise AssertionError("never runs")

    def starts_work(message: sqlqueue.Message):
        return work()

    sqlqueue.subscriber(TOPIC, group="a")(starts_work)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would fail here
        with pytest.raises(TypeError, match="returned coroutine, which is never awaited"):
            registered()[(TOPIC, "a")].handler(a_message())
        gc.collect()
