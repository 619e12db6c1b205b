"""publish() and publish_many(): what is stored, idempotency, transactions, validation."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test import override_settings

import django_sqlqueue as sqlqueue
from django_sqlqueue.db import vendor
from django_sqlqueue.models import QueueMessage
from tests.factories import QueueMessageFactory
from tests.helpers import in_other_connection, message_count, now_ms
from tests.testapp.models import Handled

pytestmark = pytest.mark.django_db

# One clock tick of the database: published_at and deliver_at are epoch milliseconds.
MS = timedelta(milliseconds=1)


def ms(value: datetime) -> int:
    return round(value.timestamp() * 1000)


# --------------------------------------------------------------------------- stored message


def test_publish_returns_the_stored_message():
    message = sqlqueue.publish(
        "orders", {"order": 1}, key="customer-7", id="order-1", headers={"trace": "abc"}
    )

    assert isinstance(message, sqlqueue.StoredMessage)
    assert message.topic == "orders"
    assert message.key == "customer-7"
    assert message.id == "order-1"
    assert message.payload == {"order": 1}
    assert message.headers == {"trace": "abc"}
    assert message.offset == QueueMessage.objects.get().offset


def test_a_stored_message_is_read_only_and_compares_by_its_fields():
    first = sqlqueue.publish("orders", {"order": 1}, key="k", id="same")
    again = sqlqueue.publish("orders", {"order": 2}, key="k", id="same")

    # The duplicate returns the stored row, whose payload is the first one.
    assert again == first
    assert again.payload == {"order": 1}
    assert "payload={'order': 1}" in repr(again)
    assert first != sqlqueue.publish("orders", {"order": 1}, key="k", id="other")
    with pytest.raises(AttributeError, match="read-only"):
        first.payload = {}  # type: ignore[misc]
    with pytest.raises(AttributeError, match="read-only"):
        first.offset = 0  # type: ignore[misc]


def test_headers_that_are_not_a_dict_are_rejected_even_when_empty():
    for bad in ([], 0, ""):
        with pytest.raises(sqlqueue.InvalidMessage, match="headers must be a dict"):
            sqlqueue.publish("orders", {}, headers=bad)
    assert message_count() == 0


def test_publish_returns_aware_utc_times_close_to_now():
    before = now_ms()
    message = sqlqueue.publish("orders", {})
    after = now_ms()

    for value in (message.published_at, message.deliver_at):
        assert value.utcoffset() == timedelta(0)
        # The database clock, read on this host: allow a little skew either way.
        assert before - 2000 <= ms(value) <= after + 2000


def test_publish_writes_the_row():
    message = sqlqueue.publish("orders", {"order": 1}, key="k", id="i", headers={"h": "v"})

    row = QueueMessage.objects.get(offset=message.offset)
    assert (row.topic, row.message_key, row.message_id) == ("orders", "k", "i")
    assert row.payload == {"order": 1}
    assert row.metadata == {"h": "v"}
    assert row.published_at == ms(message.published_at)
    assert row.deliver_at == ms(message.deliver_at)
    assert row.created_at == row.published_at


def test_published_row_waits_for_the_sequencer():
    message = sqlqueue.publish("orders", {})

    assert QueueMessage.objects.get(offset=message.offset).position is None


def test_published_row_is_not_a_dead_letter_copy():
    message = sqlqueue.publish("orders", {})

    row = QueueMessage.objects.get(offset=message.offset)
    assert (row.failed_at, row.failure_count, row.last_error) == (0, 0, "")
    assert (row.original_topic, row.original_offset, row.consumer_group) == ("", 0, "")


def test_default_id_is_a_uuid4_hex():
    message = sqlqueue.publish("orders", {})

    assert re.fullmatch(r"[0-9a-f]{32}", message.id)
    assert uuid.UUID(hex=message.id).version == 4


def test_default_ids_differ_between_messages():
    first = sqlqueue.publish("orders", {})
    second = sqlqueue.publish("orders", {})

    assert first.id != second.id
    assert first.offset != second.offset
    assert message_count() == 2


def test_default_key_is_empty():
    message = sqlqueue.publish("orders", {})

    assert message.key == ""
    assert QueueMessage.objects.get().message_key == ""


def test_offsets_increase_with_each_publish():
    offsets = [sqlqueue.publish("orders", n).offset for n in range(5)]

    assert offsets == sorted(offsets)
    assert len(set(offsets)) == 5


def test_publish_with_using_default():
    message = sqlqueue.publish("orders", {"a": 1}, using="default")

    assert QueueMessage.objects.using("default").get().offset == message.offset


# --------------------------------------------------------------------------- payloads


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param({"a": 1, "nested": {"b": [1, 2.5, None, True]}}, id="dict"),
        pytest.param([1, "two", {"three": 3}], id="list"),
        pytest.param("plain text", id="str"),
        pytest.param(42, id="int"),
        pytest.param(2.5, id="float"),
        pytest.param(True, id="bool"),
        pytest.param(None, id="none"),
        pytest.param({}, id="empty-dict"),
        pytest.param("", id="empty-str"),
    ],
)
def test_json_payload_round_trips(payload):
    message = sqlqueue.publish("orders", payload)

    assert message.payload == payload
    assert type(message.payload) is type(payload)
    assert QueueMessage.objects.get().payload == payload


def test_unicode_payload_round_trips():
    payload = {"name": "Zoë", "emoji": "\U0001f600", "cjk": "漢字"}

    message = sqlqueue.publish("orders", payload)

    assert message.payload == payload
    assert QueueMessage.objects.get().payload == payload


def test_datetime_in_payload_is_stored_as_an_iso_string():
    message = sqlqueue.publish("orders", {"at": datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)})

    assert message.payload == {"at": "2024-05-06T07:08:09Z"}


def test_decimal_in_payload_is_stored_as_a_string():
    message = sqlqueue.publish("orders", {"amount": Decimal("10.50")})

    assert message.payload == {"amount": "10.50"}


def test_uuid_in_payload_is_stored_as_a_string():
    value = uuid.UUID("12345678-1234-5678-1234-567812345678")

    message = sqlqueue.publish("orders", {"ref": value})

    assert message.payload == {"ref": "12345678-1234-5678-1234-567812345678"}


def test_payload_of_exactly_max_payload_bytes_is_accepted():
    payload = "x" * 98  # 100 bytes with the JSON quotes

    with override_settings(SQLQUEUE={"MAX_PAYLOAD_BYTES": 100}):
        message = sqlqueue.publish("orders", payload)

    assert message.payload == payload


# --------------------------------------------------------------------------- headers, delay


def test_headers_are_stored():
    headers = {"trace-id": "abc", "content-type": "application/json", "empty": ""}

    message = sqlqueue.publish("orders", {}, headers=headers)

    assert message.headers == headers
    assert QueueMessage.objects.get().metadata == headers


def test_no_headers_are_stored_as_an_empty_dict():
    message = sqlqueue.publish("orders", {})

    assert message.headers == {}
    assert QueueMessage.objects.get().metadata == {}


def test_delay_in_seconds_sets_deliver_at():
    message = sqlqueue.publish("orders", {}, delay=90)

    assert abs(message.deliver_at - message.published_at - timedelta(seconds=90)) <= MS


def test_fractional_delay_sets_deliver_at_to_the_millisecond():
    message = sqlqueue.publish("orders", {}, delay=1.5)

    assert abs(message.deliver_at - message.published_at - timedelta(seconds=1.5)) <= MS


def test_timedelta_delay_sets_deliver_at():
    message = sqlqueue.publish("orders", {}, delay=timedelta(minutes=5))

    assert abs(message.deliver_at - message.published_at - timedelta(minutes=5)) <= MS


def test_zero_delay_is_accepted():
    message = sqlqueue.publish("orders", {}, delay=0)

    assert message.deliver_at == message.published_at


def test_no_delay_makes_the_message_due_when_published():
    message = sqlqueue.publish("orders", {})

    assert message.deliver_at == message.published_at


def test_database_clock_is_read_once_per_statement():
    # publish() writes created_at, published_at and deliver_at from the same clock
    # expression in one INSERT; they agree only if the expression cannot change value
    # while the statement runs. Read it twice per row over many rows to see.
    now = vendor.now_ms_sql(connection)
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 200000) "
            f"SELECT COUNT(*), SUM(CASE WHEN {now} <> {now} THEN 1 ELSE 0 END) FROM r"
        )
        rows, disagreements = cursor.fetchone()

    assert rows > 0
    assert int(disagreements) == 0


# --------------------------------------------------------------------------- idempotency


def test_same_id_twice_stores_one_row():
    sqlqueue.publish("orders", {"v": 1}, key="k", id="same")
    sqlqueue.publish("orders", {"v": 2}, key="k", id="same")

    assert message_count() == 1


def test_same_id_twice_returns_the_first_offset_and_payload():
    first = sqlqueue.publish("orders", {"v": 1}, key="k", id="same", headers={"h": "1"})
    second = sqlqueue.publish("orders", {"v": 2}, key="k", id="same", headers={"h": "2"})

    assert second == first
    assert second.payload == {"v": 1}
    assert second.headers == {"h": "1"}


def test_duplicate_keeps_the_first_delay():
    first = sqlqueue.publish("orders", {}, id="same", delay=60)
    second = sqlqueue.publish("orders", {}, id="same")

    assert second.deliver_at == first.deliver_at
    assert second.deliver_at > second.published_at


def test_same_id_with_another_key_is_another_message():
    a = sqlqueue.publish("orders", {}, key="a", id="same")
    b = sqlqueue.publish("orders", {}, key="b", id="same")

    assert a.offset != b.offset
    assert message_count(message_id="same") == 2


def test_same_id_on_another_topic_is_another_message():
    a = sqlqueue.publish("orders", {}, id="same")
    b = sqlqueue.publish("invoices", {}, id="same")

    assert a.offset != b.offset
    assert message_count(message_id="same") == 2


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param({"id": "Order-7"}, {"id": "order-7"}, id="id-case"),
        pytest.param({"id": "order-7"}, {"id": "order-7 "}, id="id-trailing-space"),
        pytest.param({"key": "EU"}, {"key": "eu"}, id="key-case"),
        pytest.param({"key": "eu"}, {"key": "eu "}, id="key-trailing-space"),
        pytest.param({"key": "\u00e9"}, {"key": "e"}, id="key-accent"),
    ],
)
def test_names_differing_only_in_case_spaces_or_accents_are_different_messages(first, second):
    a = sqlqueue.publish("orders", "a", **{"id": "same", **first})
    b = sqlqueue.publish("orders", "b", **{"id": "same", **second})

    assert a.offset != b.offset
    assert (a.payload, b.payload) == ("a", "b")
    assert message_count() == 2


def test_topics_differing_only_in_case_are_different_messages():
    a = sqlqueue.publish("Orders", "a", id="same")
    b = sqlqueue.publish("orders", "b", id="same")

    assert a.offset != b.offset
    assert message_count() == 2


def test_duplicate_inside_one_transaction_stores_one_row():
    with transaction.atomic():
        first = sqlqueue.publish("orders", {"v": 1}, id="same")
        second = sqlqueue.publish("orders", {"v": 2}, id="same")

    assert second == first
    assert message_count() == 1


def test_duplicate_of_an_existing_row_returns_that_row():
    existing = QueueMessageFactory(topic="orders", message_key="k", message_id="known",
                                   payload={"v": "old"}, metadata={"h": "old"})

    message = sqlqueue.publish("orders", {"v": "new"}, key="k", id="known")

    assert message.offset == existing.offset
    assert message.payload == {"v": "old"}
    assert message.headers == {"h": "old"}
    assert message_count() == 1


def test_publish_many_returns_an_existing_row_for_a_known_id():
    existing = QueueMessageFactory(topic="orders", message_id="known", payload={"v": "old"})

    messages = sqlqueue.publish_many(
        "orders", [{"payload": {"v": "new"}, "id": "known"}, {"payload": {"v": "other"}}]
    )

    assert messages[0].offset == existing.offset
    assert messages[0].payload == {"v": "old"}
    assert messages[1].payload == {"v": "other"}
    assert message_count() == 2


def test_publish_many_with_a_repeated_id_stores_one_row():
    sqlqueue.publish_many(
        "orders", [{"payload": 1, "id": "twice"}, {"payload": 2}, {"payload": 3, "id": "twice"}]
    )

    assert message_count() == 2
    assert message_count(message_id="twice") == 1


def test_publish_many_with_a_repeated_id_returns_it_at_both_positions():
    messages = sqlqueue.publish_many(
        "orders", [{"payload": 1, "id": "twice"}, {"payload": 2}, {"payload": 3, "id": "twice"}]
    )

    assert len(messages) == 3
    assert messages[0] == messages[2]
    assert messages[1].payload == 2
    assert messages[0].offset != messages[1].offset


def test_publish_many_with_a_repeated_id_keeps_the_first_occurrence():
    # As with two publish() calls, the later duplicate is a no-op.
    messages = sqlqueue.publish_many(
        "orders", [{"payload": "first", "id": "twice"}, {"payload": "second", "id": "twice"}]
    )

    assert [m.payload for m in messages] == ["first", "first"]
    assert QueueMessage.objects.get().payload == "first"


# --------------------------------------------------------------------------- transactions


def test_rolled_back_publish_leaves_no_row():
    with pytest.raises(RuntimeError), transaction.atomic():
        sqlqueue.publish("orders", {})
        raise RuntimeError("roll back")

    assert message_count() == 0


def test_nested_savepoint_rollback_keeps_only_the_outer_messages():
    with transaction.atomic():
        outer_before = sqlqueue.publish("orders", "outer-before")
        with pytest.raises(RuntimeError), transaction.atomic():
            sqlqueue.publish("orders", "inner")
            raise RuntimeError("roll back the savepoint")
        outer_after = sqlqueue.publish("orders", "outer-after")

    stored = list(QueueMessage.objects.order_by("offset").values_list("offset", "payload"))
    assert stored == [(outer_before.offset, "outer-before"), (outer_after.offset, "outer-after")]


def test_rolled_back_id_can_be_published_again():
    with pytest.raises(RuntimeError), transaction.atomic():
        sqlqueue.publish("orders", "lost", id="retry-me")
        raise RuntimeError("roll back")

    message = sqlqueue.publish("orders", "kept", id="retry-me")

    assert message.payload == "kept"
    assert message_count() == 1


def _exists_in_this_thread(offset: int) -> bool:
    return QueueMessage.objects.filter(offset=offset).exists()


@pytest.mark.django_db(transaction=True)
def test_publish_outside_a_transaction_is_visible_to_another_connection_at_once():
    message = sqlqueue.publish("orders", {})

    assert in_other_connection(_exists_in_this_thread, message.offset)


@pytest.mark.django_db(transaction=True)
def test_committed_transaction_makes_the_message_visible_to_another_connection():
    with transaction.atomic():
        message = sqlqueue.publish("orders", {})

    assert in_other_connection(_exists_in_this_thread, message.offset)


@pytest.mark.django_db(transaction=True)
def test_uncommitted_message_is_invisible_to_another_connection():
    seen: list[bool] = []
    with transaction.atomic():
        message = sqlqueue.publish("orders", {})
        seen.append(in_other_connection(_exists_in_this_thread, message.offset))
    seen.append(in_other_connection(_exists_in_this_thread, message.offset))

    assert seen == [False, True]


@pytest.mark.django_db(transaction=True)
def test_rolled_back_transaction_leaves_nothing_for_another_connection():
    with pytest.raises(RuntimeError), transaction.atomic():
        message = sqlqueue.publish("orders", {})
        raise RuntimeError("roll back")

    assert not in_other_connection(_exists_in_this_thread, message.offset)
    assert message_count() == 0


# --------------------------------------------------------------------------- validation


def reject(match: str, topic="orders", payload=None, **kwargs) -> sqlqueue.InvalidMessage:
    """publish() must raise InvalidMessage matching ``match`` and write nothing."""
    with pytest.raises(sqlqueue.InvalidMessage, match=match) as info:
        sqlqueue.publish(topic, payload if payload is not None else {}, **kwargs)
    assert message_count() == 0
    return info.value


def test_invalid_message_is_a_value_error_and_a_sqlqueue_error():
    error = reject("topic must not be empty", topic="")

    assert isinstance(error, ValueError)
    assert isinstance(error, sqlqueue.SQLQueueError)


def test_empty_topic_is_rejected():
    reject("topic must not be empty", topic="")


def test_non_str_topic_is_rejected():
    reject("topic must be a str, got int", topic=7)


def test_topic_over_200_characters_is_rejected():
    reject("topic is 201 characters long; the limit is 200", topic="t" * 201)


def test_topic_of_200_characters_is_accepted():
    message = sqlqueue.publish("t" * 200, {})

    assert message.topic == "t" * 200


@pytest.mark.parametrize(
    ("topic", "bad"),
    [
        pytest.param("order events", " ", id="space"),
        pytest.param("orders/eu", "/", id="slash"),
        pytest.param("caf\u00e9", "\u00e9", id="accent"),
    ],
)
def test_topic_with_forbidden_characters_names_them(topic, bad):
    error = reject("use only letters, digits", topic=topic)

    assert f"contains {bad!r}" in str(error)


def test_topic_of_letters_digits_dots_dashes_and_underscores_is_accepted():
    message = sqlqueue.publish("Billing.v2_orders-EU", {})

    assert message.topic == "Billing.v2_orders-EU"


def test_key_over_255_characters_is_rejected():
    reject("key is 256 characters long; the limit is 255", key="k" * 256)


def test_key_of_255_characters_is_accepted():
    message = sqlqueue.publish("orders", {}, key="k" * 255)

    assert QueueMessage.objects.get(offset=message.offset).message_key == "k" * 255


def test_non_str_key_is_rejected():
    reject("key must be a str, got int", key=5)


def test_id_over_128_characters_is_rejected():
    reject("id is 129 characters long; the limit is 128", id="i" * 129)


def test_id_of_128_characters_is_accepted():
    message = sqlqueue.publish("orders", {}, id="i" * 128)

    assert QueueMessage.objects.get(offset=message.offset).message_id == "i" * 128


def test_empty_id_is_rejected():
    reject("id must not be empty", id="")


def test_non_str_id_is_rejected():
    reject("id must be a str, got UUID", id=uuid.uuid4())


def test_payload_that_is_not_json_serializable_names_the_type():
    error = reject("payload is not JSON-serializable", payload={"x": object()})

    assert "object" in str(error).replace("JSON-serializable", "")


def test_payload_with_nan_is_rejected():
    reject("payload is not valid JSON", payload={"x": float("nan")})


def test_payload_with_infinity_is_rejected():
    reject("payload is not valid JSON", payload=[float("inf")])


def test_payload_over_max_payload_bytes_states_size_and_limit():
    payload = "x" * 99  # 101 bytes with the JSON quotes

    with override_settings(SQLQUEUE={"MAX_PAYLOAD_BYTES": 100}):
        reject(re.escape("payload is 101 bytes as JSON, over SQLQUEUE['MAX_PAYLOAD_BYTES'] = 100"),
               payload=payload)


def test_payload_size_is_measured_on_the_json_text():
    # Non-ASCII characters are written as \uXXXX escapes: 17 characters, 104 bytes.
    payload = "\u00e9" * 17

    with override_settings(SQLQUEUE={"MAX_PAYLOAD_BYTES": 100}):
        reject("payload is 104 bytes as JSON", payload=payload)


def test_negative_delay_is_rejected():
    reject("delay must not be negative", delay=-1)


def test_negative_timedelta_delay_is_rejected():
    reject("delay must not be negative", delay=timedelta(seconds=-5))


def test_string_delay_is_rejected():
    reject("delay must be seconds .* or a timedelta, got str", delay="10")


def test_bool_delay_is_rejected():
    reject("delay must be seconds .* or a timedelta, got bool", delay=True)


def test_infinite_delay_is_rejected():
    reject("delay must be a finite number of seconds", delay=float("inf"))


@pytest.mark.parametrize(
    "seconds",
    [
        pytest.param(1e12, id="past-the-year-9999"),
        pytest.param(1e17, id="past-bigint"),
    ],
)
def test_delay_over_1000_years_is_rejected(seconds):
    # deliver_at would be no datetime, or no BIGINT (which MySQL's INSERT IGNORE clips).
    reject("delay must be at most 365250 days", delay=seconds)


def test_delay_of_1000_years_is_accepted():
    message = sqlqueue.publish("orders", {}, delay=timedelta(days=365_250))

    assert abs(message.deliver_at - message.published_at - timedelta(days=365_250)) <= MS


def test_headers_that_are_not_a_dict_are_rejected():
    reject("headers must be a dict of str to str, got list", headers=[("a", "b")])


def test_header_value_that_is_not_a_str_is_rejected():
    reject("header 'retries' must have a str value, got int", headers={"retries": 3})


def test_header_name_that_is_not_a_str_is_rejected():
    reject("header names must be str, got int 1", headers={1: "one"})


# --------------------------------------------------------------------------- unstorable text
#
# No database stores NUL (PostgreSQL refuses it) or a lone UTF-16 surrogate (not a
# character; a filename decoded with "surrogateescape" has them), wherever they are.

UNSTORABLE = [
    pytest.param("\x00", "a NUL character", id="nul"),
    pytest.param("\udc80", "a lone surrogate", id="lone-low-surrogate"),
    pytest.param("\ud83d", "a lone surrogate", id="lone-high-surrogate"),
]
PLACES = [
    pytest.param(lambda bad: {"payload": f"a{bad}b"}, "payload contains", id="payload"),
    pytest.param(lambda bad: {"payload": {"files": [{"name": f"x{bad}.txt"}]}},
                 re.escape("payload['files'][0]['name'] contains"), id="nested-value"),
    pytest.param(lambda bad: {"payload": {"a": {f"k{bad}": 1}}},
                 re.escape("payload['a'] key 'k"), id="nested-key"),
    pytest.param(lambda bad: {"headers": {"h": f"v{bad}"}}, "header 'h' contains",
                 id="header-value"),
    pytest.param(lambda bad: {"headers": {f"h{bad}": "v"}}, "header name 'h", id="header-name"),
    pytest.param(lambda bad: {"key": f"k{bad}"}, "key contains", id="key"),
    pytest.param(lambda bad: {"id": f"i{bad}"}, "id contains", id="id"),
]


@pytest.mark.parametrize(("bad", "what"), UNSTORABLE)
@pytest.mark.parametrize(("place", "where"), PLACES)
def test_unstorable_text_is_refused_naming_where_it_is(bad, what, place, where):
    error = reject(where, **{"payload": {}, **place(bad)})

    assert what in str(error)


@pytest.mark.parametrize(("bad", "what"), UNSTORABLE)
def test_publish_many_refuses_unstorable_text_naming_the_message(bad, what):
    reject_many(re.escape("messages[1]: payload['name'] contains ") + what,
                [{"payload": 1}, {"payload": {"name": bad}}])


@pytest.mark.django_db(transaction=True)
def test_refused_unstorable_text_leaves_the_callers_transaction_usable():
    with transaction.atomic():
        sqlqueue.publish("orders", "before")
        with pytest.raises(sqlqueue.InvalidMessage):
            sqlqueue.publish("orders", "\x00")
        for bad in ({"headers": {"h": "\udc80"}}, {"key": "\x00"}, {"id": "\udc80"}):
            with pytest.raises(sqlqueue.InvalidMessage):
                sqlqueue.publish("orders", "refused", **bad)
        with pytest.raises(sqlqueue.InvalidMessage):
            sqlqueue.publish_many("orders", [{"payload": "ok"}, {"payload": ["\udc80"]}])
        sqlqueue.publish("orders", "after")
        Handled.objects.create(group="g", topic="orders", key="", offset=0, message_id="m",
                               attempt=1, pid=0, handled_at=0.0)

    assert list(QueueMessage.objects.order_by("offset").values_list("payload", flat=True)) == [
        "before", "after"
    ]
    assert Handled.objects.count() == 1


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("C:\\u0000", id="backslash-u0000"),
        pytest.param("\\ud83d", id="backslash-ud83d"),
        pytest.param("\\\U0001f600", id="backslash-then-emoji"),
        pytest.param("\\\\u0000", id="two-backslashes-u0000"),
        pytest.param("\U0001f600 \u00e9 \u6f22", id="emoji-and-accents"),
    ],
)
def test_text_that_only_looks_like_an_unstorable_escape_is_stored(text):
    message = sqlqueue.publish("orders", {text: text}, key=text, id=text, headers={text: text})

    row = QueueMessage.objects.get(offset=message.offset)
    assert row.payload == {text: text}
    assert row.metadata == {text: text}
    assert (row.message_key, row.message_id) == (text, text)


def test_a_backslash_before_a_lone_surrogate_does_not_hide_it():
    reject("payload contains a lone surrogate", payload="\\\udc80")


# --------------------------------------------------------------------------- publish_many checks


def reject_many(match: str, messages, topic="orders") -> sqlqueue.InvalidMessage:
    with pytest.raises(sqlqueue.InvalidMessage, match=match) as info:
        sqlqueue.publish_many(topic, messages)
    assert message_count() == 0
    return info.value


def test_publish_many_with_one_bad_message_writes_nothing_and_names_its_index():
    messages = [{"payload": 1}, {"payload": 2}, {"payload": 3, "key": 99}, {"payload": 4}]

    reject_many(re.escape("messages[2]: key must be a str, got int"), messages)


def test_publish_many_with_a_bad_message_after_a_full_batch_writes_nothing():
    messages = [{"payload": n} for n in range(12)] + [{"payload": object()}]

    with override_settings(SQLQUEUE={"PUBLISH_BATCH_SIZE": 5}):
        reject_many(re.escape("messages[12]: payload is not JSON-serializable"), messages)


def test_publish_many_message_without_payload_is_rejected():
    reject_many(re.escape('messages[1]: "payload" is required'),
                [{"payload": 1}, {"key": "k"}])


def test_publish_many_message_with_an_unknown_field_is_rejected():
    reject_many(re.escape("messages[0]: unknown field(s) priority; allowed: "),
                [{"payload": 1, "priority": 5}])


def test_publish_many_message_that_is_not_a_dict_is_rejected():
    reject_many(re.escape("messages[0]: each message must be a dict, got str"), ["payload"])


def test_publish_many_with_an_invalid_topic_is_rejected():
    reject_many("topic must not be empty", [{"payload": 1}], topic="")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        pytest.param("key", "k" * 256, "key is 256 characters long", id="key"),
        pytest.param("id", "i" * 129, "id is 129 characters long", id="id"),
    ],
)
def test_publish_many_with_an_over_long_value_writes_nothing(field, value, match):
    # MySQL's INSERT IGNORE would truncate it: it must be refused before the INSERT, even
    # in a batch with a duplicate and a new message.
    QueueMessageFactory(topic="orders", message_key="k", message_id="known")
    messages = [{"payload": 1, "key": "k", "id": "known"}, {"payload": 2},
                {"payload": 3, field: value}]

    with pytest.raises(sqlqueue.InvalidMessage, match=match):
        sqlqueue.publish_many("orders", messages)

    assert message_count() == 1


def deeply_nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("message_id", [None, "deep"], ids=["generated-id", "given-id"])
def test_a_payload_nested_deeper_than_the_limit_raises_invalid_message_and_writes_nothing(
        message_id):
    # MAX_PAYLOAD_DEPTH (31) on every backend: MariaDB's JSON check refuses more, and
    # INSERT IGNORE would drop such a row with a warning instead of failing.
    reject("nested too deeply: 40 levels", payload=deeply_nested(40), id=message_id)


def test_publish_many_with_a_payload_nested_deeper_than_the_limit_writes_nothing():
    reject_many("nested too deeply",
                [{"payload": 1}, {"payload": deeply_nested(40)}, {"payload": 3}])


def test_publish_many_of_nothing_returns_an_empty_list_and_writes_nothing():
    assert sqlqueue.publish_many("orders", []) == []
    assert message_count() == 0


# --------------------------------------------------------------------------- publish_many


def test_publish_many_stores_every_field():
    messages = sqlqueue.publish_many(
        "orders",
        [
            {"payload": {"n": 1}, "key": "a", "id": "one", "headers": {"h": "1"}},
            {"payload": [2], "key": "b", "delay": 30},
        ],
    )

    first, second = messages
    assert (first.topic, first.key, first.id, first.payload, first.headers) == (
        "orders", "a", "one", {"n": 1}, {"h": "1"}
    )
    assert first.deliver_at == first.published_at
    assert (second.key, second.payload, second.headers) == ("b", [2], {})
    assert re.fullmatch(r"[0-9a-f]{32}", second.id)
    assert abs(second.deliver_at - second.published_at - timedelta(seconds=30)) <= MS


def test_publish_many_accepts_a_generator():
    messages = sqlqueue.publish_many("orders", ({"payload": n} for n in range(3)))

    assert [m.payload for m in messages] == [0, 1, 2]
    assert message_count() == 3


def test_publish_many_over_the_batch_size_writes_every_message_in_order():
    count = 1200  # more than the default PUBLISH_BATCH_SIZE of 500

    messages = sqlqueue.publish_many(
        "orders", [{"payload": n, "key": f"k{n % 7}"} for n in range(count)]
    )

    assert [m.payload for m in messages] == list(range(count))
    # Within a partition (key), offsets follow the order given: the consumption order.
    for key in {m.key for m in messages}:
        offsets = [m.offset for m in messages if m.key == key]
        assert all(a < b for a, b in zip(offsets, offsets[1:], strict=False))
    assert message_count(topic="orders") == count
    stored = dict(QueueMessage.objects.values_list("offset", "payload"))
    assert all(stored[m.offset] == m.payload for m in messages)


def test_publish_many_of_more_bytes_than_one_statement_may_carry_stores_every_message():
    # 20 x 900 KB is 18 MB: over MariaDB's default max_allowed_packet (16 MiB) as one
    # INSERT, so publish_many splits batches by bytes as well as by rows.
    blob = "x" * 900_000
    messages = sqlqueue.publish_many(
        "orders", [{"payload": {"n": n, "blob": blob}, "key": "k"} for n in range(20)]
    )

    offsets = [message.offset for message in messages]
    assert offsets == sorted(offsets)
    stored = QueueMessage.objects.order_by("offset").values_list("payload", flat=True)
    assert [(p["n"], len(p["blob"])) for p in stored] == [(n, 900_000) for n in range(20)]


def test_publish_many_rolls_back_with_the_surrounding_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        sqlqueue.publish_many("orders", [{"payload": n} for n in range(1200)])
        assert message_count() == 1200
        raise RuntimeError("roll back")

    assert message_count() == 0


def test_publish_many_commits_with_the_surrounding_transaction():
    with transaction.atomic():
        sqlqueue.publish("orders", "single")
        sqlqueue.publish_many("orders", [{"payload": n} for n in range(3)])

    assert message_count() == 4

