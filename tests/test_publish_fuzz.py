"""publish() and publish_many() given arbitrary input: stored exactly, or refused cleanly.

Every input either lands in the log and reads back from the database exactly as given
(JSON's own conversions aside: tuples become lists), or is refused with InvalidMessage
before anything is written, leaving the caller's transaction usable. No input may make
the database raise instead, and publish_many() stores all of its messages or none.

Each example runs in a savepoint that is rolled back afterwards, so examples do not see
each other's rows. The examples are derived from the test's name (see conftest.py), so a
run is repeatable; ``HYPOTHESIS_PROFILE=explore`` draws new ones.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

import django_sqlqueue as sqlqueue
from django_sqlqueue.limits import MAX_PAYLOAD_DEPTH
from django_sqlqueue.models import QueueMessage
from tests.testapp.models import Handled

pytestmark = pytest.mark.django_db

MAX_DELAY_SECONDS = 365_250 * 86_400  # the documented 1,000 years
UNSTORABLE = ["\x00", "\udc80", "\ud83d"]  # NUL, a lone low and a lone high surrogate

# --------------------------------------------------------------------------- strategies

# Any character a database stores: everything but NUL and the surrogates (category Cs).
storable_chars = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
storable_text = st.text(storable_chars, max_size=30)


def with_unstorable(text: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Text with a NUL or a lone surrogate put somewhere in it."""
    return st.builds(lambda t, bad, at: t[:at] + bad + t[at:],
                     text, st.sampled_from(UNSTORABLE), st.integers(0, 30))


topics = st.from_regex(r"[A-Za-z0-9._-]{1,200}", fullmatch=True)
keys = st.text(storable_chars, max_size=255)
ids = st.none() | st.text(storable_chars, min_size=1, max_size=128)
headers = st.none() | st.dictionaries(storable_text, storable_text, max_size=4)
delays = st.none() | st.integers(0, 10**6) | st.floats(0, 1e6) | st.timedeltas(
    min_value=timedelta(0), max_value=timedelta(days=30))

big_ints = st.sampled_from([2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**40, -(10**100), 10**4000])
numbers = (st.integers() | big_ints
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.sampled_from([1e16, 1e308, -1.7976931348623157e308, 5e-324, -0.0, 2.5e-300]))
scalars = st.none() | st.booleans() | numbers | st.text(storable_chars, max_size=40)
payloads = st.recursive(
    scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(storable_text, inner, max_size=4)),
    max_leaves=16,
)


def nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


# Values publish() must refuse, by argument. Each strategy makes one bad value.
bad_topics = (st.just("") | st.text(min_size=201, max_size=210, alphabet="ab")
              | st.builds(lambda t, c: t + c, topics.filter(lambda t: len(t) < 200),
                          st.sampled_from(["\n", " ", "/", "é", "\x00", ":"]))
              | st.sampled_from([None, 7, b"orders"]))
bad_keys = (st.text(storable_chars, min_size=256, max_size=260) | with_unstorable(storable_text)
            | st.sampled_from([None, 7, b"k", ["k"]]))
bad_ids = (st.just("") | st.text(storable_chars, min_size=129, max_size=135)
           | with_unstorable(storable_text) | st.sampled_from([7, b"i", 1.5]))
bad_headers = (st.sampled_from([[], "h", 0, {"h": 1}, {1: "v"}, {"h": None}])
               | st.builds(lambda k, v: {k: v}, storable_text, with_unstorable(storable_text))
               | st.builds(lambda k, v: {k: v}, with_unstorable(storable_text), storable_text))
bad_delays = (st.floats(max_value=-1e-9) | st.integers(max_value=-1)
              | st.sampled_from([math.nan, math.inf, -math.inf, "5", True, [1], MAX_DELAY_SECONDS + 1,
                                 timedelta(days=-1), timedelta(days=365_251)]))
bad_payloads = (
    st.builds(lambda p, bad: [p, bad], payloads, with_unstorable(storable_text))
    | st.builds(lambda p, bad: {bad: p}, payloads, with_unstorable(storable_text))
    | st.sampled_from([math.nan, [math.inf], {"x": -math.inf}, object(), {1, 2}, b"bytes"])
)
BAD_ARGUMENTS = {"topic": bad_topics, "key": bad_keys, "id": bad_ids, "headers": bad_headers,
                 "delay": bad_delays, "payload": bad_payloads}


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    """A valid publish_many() element: a payload and any of the optional fields."""
    message = {"payload": draw(payloads)}
    for field, strategy in (("key", keys), ("id", ids), ("headers", headers), ("delay", delays)):
        value = draw(strategy)
        if value is not None or draw(st.booleans()):
            message[field] = value
    return message


# --------------------------------------------------------------------------- helpers


@contextmanager
def rolled_back() -> Iterator[None]:
    """A savepoint undone at the end: each example starts from an empty log."""
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


def as_json(value: Any) -> Any:
    """``value`` as JSON gives it back: tuples become lists, keys become strings."""
    return json.loads(json.dumps(value))


def assert_same_json(actual: Any, expected: Any, path: str = "payload") -> None:
    """Equal, and of the same types all the way down: 1e16 is not 10**16, True is not 1."""
    assert type(actual) is type(expected), f"{path}: {actual!r} is not {expected!r}"
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys(), path
        for name in expected:
            assert_same_json(actual[name], expected[name], f"{path}[{name!r}]")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), path
        for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
            assert_same_json(got, want, f"{path}[{index}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def delay_ms(delay: Any) -> int:
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay or 0)
    return round(seconds * 1000)


def assert_stored(stored: sqlqueue.StoredMessage, topic: str, message: dict[str, Any]) -> None:
    """The row behind ``stored``, read from the database, holds exactly ``message``."""
    row = QueueMessage.objects.get(offset=stored.offset)
    assert (row.topic, row.message_key) == (topic, message.get("key", ""))
    if message.get("id") is not None:
        assert row.message_id == message["id"]
    assert row.message_id == stored.id
    assert_same_json(row.payload, as_json(message["payload"]))
    assert_same_json(stored.payload, as_json(message["payload"]))
    assert row.metadata == (message.get("headers") or {})
    assert row.deliver_at - row.published_at == delay_ms(message.get("delay"))


def assert_transaction_usable() -> None:
    """After a refusal the caller's transaction still takes writes and reads."""
    sqlqueue.publish("fuzz.after", "after")
    Handled.objects.create(group="g", topic="t", key="", offset=0, message_id="m", attempt=1,
                           pid=0, handled_at=0.0)
    assert QueueMessage.objects.filter(topic="fuzz.after").count() == 1
    assert Handled.objects.count() == 1


def publish_one(topic: Any, message: dict[str, Any]) -> sqlqueue.StoredMessage:
    fields = {name: message[name] for name in ("key", "id", "headers", "delay") if name in message}
    return sqlqueue.publish(topic, message["payload"], **fields)


# --------------------------------------------------------------------------- publish()


@given(topic=topics, message=messages())
def test_any_valid_message_is_stored_and_read_back_exactly(topic, message):
    with rolled_back():
        stored = publish_one(topic, message)

        assert_stored(stored, topic, message)


@given(data=st.data(), topic=topics, message=messages(),
       argument=st.sampled_from(sorted(BAD_ARGUMENTS)))
def test_a_message_with_one_bad_argument_is_refused_with_invalid_message(
        data, topic, message, argument):
    bad = data.draw(BAD_ARGUMENTS[argument], label=argument)
    if argument == "topic":
        topic = bad
    else:
        message[argument] = bad
    with rolled_back():
        with pytest.raises(sqlqueue.InvalidMessage):
            publish_one(topic, message)

        assert QueueMessage.objects.count() == 0
        assert_transaction_usable()


@given(topic=st.text(max_size=12) | topics,
       payload=payloads | bad_payloads | st.integers(0, 40).map(nested),
       key=st.text(max_size=12) | keys | bad_keys, message_id=ids | bad_ids,
       header_values=headers | bad_headers, delay=delays | bad_delays)
def test_any_input_is_either_stored_exactly_or_refused_leaving_the_transaction_usable(
        topic, payload, key, message_id, header_values, delay):
    message = {"payload": payload, "key": key, "id": message_id, "headers": header_values,
               "delay": delay}
    with rolled_back():
        try:
            stored = publish_one(topic, message)
        except sqlqueue.InvalidMessage:
            assert QueueMessage.objects.count() == 0
            assert_transaction_usable()
        else:
            assert_stored(stored, topic, message)


@given(payload=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=300)
       | st.lists(st.integers() | st.text(storable_chars, max_size=20), max_size=40),
       limit=st.integers(2, 400))
def test_a_payload_is_accepted_exactly_up_to_max_payload_bytes_of_json(payload, limit):
    size = len(json.dumps(payload, separators=(",", ":")))  # non-ASCII as \u escapes
    with override_settings(SQLQUEUE={"MAX_PAYLOAD_BYTES": limit}), rolled_back():
        if size <= limit:
            assert_stored(sqlqueue.publish("fuzz", payload), "fuzz", {"payload": payload})
        else:
            with pytest.raises(sqlqueue.InvalidMessage, match=f"payload is {size} bytes"):
                sqlqueue.publish("fuzz", payload)
            assert QueueMessage.objects.count() == 0


# --------------------------------------------------------------------------- publish_many()


@given(topic=topics, batch=st.lists(messages(), min_size=1, max_size=12),
       batch_size=st.integers(1, 5))
def test_a_valid_batch_is_stored_whole_each_id_once_in_order_per_key(topic, batch, batch_size):
    with override_settings(SQLQUEUE={"PUBLISH_BATCH_SIZE": batch_size}), rolled_back():
        stored = sqlqueue.publish_many(topic, batch)

        assert len(stored) == len(batch)
        # A repeated (key, id) is stored once, as its first occurrence.
        first: dict[tuple[str, str], tuple[sqlqueue.StoredMessage, dict[str, Any]]] = {}
        for result, message in zip(stored, batch, strict=True):
            if message.get("id") is not None:
                first.setdefault((message.get("key", ""), message["id"]), (result, message))
                assert result.offset == first[(message.get("key", ""), message["id"])][0].offset
            else:
                first[(message.get("key", ""), result.id)] = (result, message)
        assert QueueMessage.objects.count() == len(first)
        for result, message in first.values():
            assert_stored(result, topic, message)
        # Within a key, offsets (the order of consumption) follow the list.
        for key in {k for k, _ in first}:
            offsets = [r.offset for (k, _), (r, _) in first.items() if k == key]
            assert offsets == sorted(offsets)


@given(data=st.data(), topic=topics, batch=st.lists(messages(), min_size=1, max_size=8),
       argument=st.sampled_from(sorted(set(BAD_ARGUMENTS) - {"topic"})),
       batch_size=st.integers(1, 4))
def test_a_batch_with_one_bad_message_stores_none_of_it_and_names_the_message(
        data, topic, batch, argument, batch_size):
    index = data.draw(st.integers(0, len(batch)), label="index")
    bad_message = data.draw(messages(), label="message")
    bad_message[argument] = data.draw(BAD_ARGUMENTS[argument], label=argument)
    batch.insert(index, bad_message)
    with override_settings(SQLQUEUE={"PUBLISH_BATCH_SIZE": batch_size}), rolled_back():
        with pytest.raises(sqlqueue.InvalidMessage, match=re.escape(f"messages[{index}]")):
            sqlqueue.publish_many(topic, batch)

        assert QueueMessage.objects.count() == 0
        assert_transaction_usable()


@given(batch=st.lists(st.dictionaries(st.sampled_from(["payload", "key", "id", "headers",
                                                        "delay", "priority", "Payload"]),
                                      payloads | keys | bad_keys, max_size=4)
                      | st.sampled_from([None, "m", 1, ["payload"]]), max_size=6))
def test_a_batch_of_malformed_elements_is_stored_whole_or_refused_whole(batch):
    with rolled_back():
        try:
            stored = sqlqueue.publish_many("fuzz", batch)
        except sqlqueue.InvalidMessage:
            assert QueueMessage.objects.count() == 0
            assert_transaction_usable()
        else:
            seen: set[tuple[str, str]] = set()
            for result, message in zip(stored, batch, strict=True):
                if (result.key, result.id) not in seen:  # a repeated id stores its first
                    seen.add((result.key, result.id))
                    assert_stored(result, "fuzz", message)


@pytest.mark.parametrize("messages_argument", [None, 7, {"payload": 1}, {"payload": 1}.items()])
def test_publish_many_refuses_something_that_is_not_a_list_of_messages(messages_argument):
    with pytest.raises(sqlqueue.InvalidMessage):
        sqlqueue.publish_many("fuzz", messages_argument)

    assert QueueMessage.objects.count() == 0


# --------------------------------------------------------------------------- regressions


@pytest.mark.parametrize("topic", ["orders\n", "orders\n\n", "\norders"])
def test_a_topic_with_a_line_break_is_refused(topic):
    with pytest.raises(sqlqueue.InvalidMessage, match="contains '\\\\n'"):
        sqlqueue.publish(topic, 1)

    assert QueueMessage.objects.count() == 0


@pytest.mark.parametrize("value", [1e16, 1e22, 1.7976931348623157e308, -2.5e300, 123456789e10])
def test_a_large_float_reads_back_as_the_same_float(value):
    # PostgreSQL's jsonb keeps numbers as numeric and gives 1e+16 back as 10000000000000000,
    # which JSON decodes as an int.
    stored = sqlqueue.publish("fuzz", {"n": value, "list": [value]})

    payload = QueueMessage.objects.get(offset=stored.offset).payload
    assert_same_json(payload, {"n": value, "list": [value]})


def test_a_string_that_looks_like_a_large_float_is_left_alone():
    payload = {"1e+16": "1e+16", "quoted": 'say "2e+20"', "escaped": "\\", "n": 3e+20}

    stored = sqlqueue.publish("fuzz", payload)

    assert_same_json(QueueMessage.objects.get(offset=stored.offset).payload, payload)


@pytest.mark.django_db(transaction=True)
def test_headers_over_max_payload_bytes_are_refused_before_the_database_sees_them():
    # 20 MB is over MariaDB's max_allowed_packet, which it answers by closing the connection.
    with transaction.atomic():
        sqlqueue.publish("fuzz", "before")
        with pytest.raises(sqlqueue.InvalidMessage, match="headers are .* bytes as JSON, over"):
            sqlqueue.publish("fuzz", 1, headers={"h": "x" * (20 * 1024 * 1024)})
        sqlqueue.publish("fuzz", "after")

    assert list(QueueMessage.objects.order_by("offset").values_list("payload", flat=True)) == [
        "before", "after"]


def test_headers_up_to_max_payload_bytes_are_stored():
    header = {"h": "x" * 92}  # {"h":"xx..."} is 100 bytes

    with override_settings(SQLQUEUE={"MAX_PAYLOAD_BYTES": 100}):
        stored = sqlqueue.publish("fuzz", 1, headers=header)
        with pytest.raises(sqlqueue.InvalidMessage, match="headers are 101 bytes"):
            sqlqueue.publish("fuzz", 1, headers={"h": "x" * 93})

    assert QueueMessage.objects.get(offset=stored.offset).metadata == header


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("levels", [31, 32, 2000, 2001, 5000])
def test_a_payload_nested_deeper_than_the_limit_is_refused_leaving_the_transaction_usable(
        levels):
    # MAX_PAYLOAD_DEPTH (31) on every backend and Python version: below what MariaDB's
    # JSON check (31), SQLite's (2,000) and Python's decoder (some 1,000 levels on 3.11)
    # take. The refusal comes as InvalidMessage, before the database sees the row.
    payload = nested(levels)
    with transaction.atomic():
        if levels <= MAX_PAYLOAD_DEPTH:
            sqlqueue.publish("fuzz", payload)
        else:
            with pytest.raises(sqlqueue.InvalidMessage, match=f"nested too deeply: {levels} "):
                sqlqueue.publish("fuzz", payload)
        sqlqueue.publish("fuzz", "after")

    stored = list(QueueMessage.objects.order_by("offset").values_list("payload", flat=True))
    assert stored == ([payload] if levels <= MAX_PAYLOAD_DEPTH else []) + ["after"]


@pytest.mark.parametrize(("payload", "match"), [
    pytest.param(nested(10_050), "nested too deeply", id="deeper-than-python-encodes"),
    pytest.param([10**5000], "not valid JSON.*digits", id="int-of-5000-digits"),
])
def test_a_payload_python_cannot_encode_is_refused(payload, match):
    with pytest.raises(sqlqueue.InvalidMessage, match=match):
        sqlqueue.publish("fuzz", payload)

    assert QueueMessage.objects.count() == 0
