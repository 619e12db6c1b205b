"""Migration 0003: a 0002 database (a partition is a key) becomes one with N partitions per topic.

Each test rebuilds the 0002 schema, fills it with raw SQL in the old shape (per-key
watermarks, delivery rows and leases), runs the real migration with ``MigrationExecutor``
and checks what it left. 0003 cannot be unapplied, so the fixture gets to 0002 by dropping
the app's tables, forgetting its migrations and migrating forward from nothing; it always
leaves the database at the latest migration, which every other test expects.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import import_module

import pytest
from django.apps import apps
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder

import django_sqlqueue as sqlqueue
from django_sqlqueue.consuming.registry import Subscription, subscriptions, unregister
from django_sqlqueue.models import (
    ConsumerOffset,
    DeliveryState,
    PartitionLease,
    QueueMessage,
    SubscriberHeartbeat,
    Topic,
)
from django_sqlqueue.worker.process import Worker
from tests.factories import QueueMessageFactory

pytestmark = pytest.mark.django_db(transaction=True)

APP = "django_sqlqueue"
OLD = (APP, "0002_binary_collation")
# Every table the app's migrations create, dropped before rebuilding from an old schema.
TABLES = tuple(sorted({
    model._meta.db_table for model in apps.get_app_config(APP).get_models()
    if model._meta.managed and not model._meta.proxy
}))

# Partitions per topic under tests/settings.py: PARTITIONS=4, orders=12, slow=1.
COUNTS = {"orders": 12, "slow": 1, "events": 4, "orders_dlq": 4, "idle": 4}
GROUPS = ("ledger", "audit")
CONSUMED = ("orders", "slow", "events")

# The log in insertion (offset) order: (topic, key, id, position); None = not sequenced yet.
# alice and carol (partition 11 of orders) share an id; bob and dave share partition 8;
# some rows were committed out of offset order (a-5 before a-4, j-3 not yet sequenced).
LOG: list[tuple[str, str, str, int | None]] = [
    ("orders", "", "o-1", 1),
    ("orders", "bob", "b-1", 2),
    ("orders", "alice", "a-1", 3),
    ("orders", "carol", "c-1", 4),
    ("orders", "dave", "d-1", 5),
    ("orders", "frank", "f-1", 6),
    ("orders", "alice", "a-2", 7),
    ("orders", "bob", "b-2", 8),
    ("orders", "carol", "same-id", 9),
    ("orders", "", "o-2", 10),
    ("orders", "dave", "d-2", 11),
    ("orders", "alice", "same-id", 12),
    ("orders", "alice", "a-5", 31),
    ("orders", "frank", "f-2", 13),
    ("orders", "bob", "b-3", 14),
    ("orders", "carol", "c-3", 15),
    ("orders", "", "o-3", 16),
    ("slow", "ivan", "i-1", 17),
    ("slow", "judy", "j-1", 18),
    ("slow", "judy", "j-3", None),
    ("slow", "", "s-1", 19),
    ("orders", "alice", "a-4", 20),
    ("events", "erin", "e-1", 21),
    ("slow", "", "s-2", 22),
    ("slow", "ivan", "i-2", 23),
    ("slow", "judy", "j-2", 24),
    ("orders", "", "o-4", 25),
    ("orders", "bob", "b-4", 26),
    ("slow", "ivan", "i-3", 27),
    ("events", "erin", "e-2", 28),
    ("events", "grace", "g-1", 29),
    ("events", "", "v-1", 30),
    ("events", "grace", "g-2", 32),
    ("events", "erin", "e-3", 33),
    ("events", "grace", "g-3", 34),
    ("events", "", "v-2", 35),
    ("orders", "alice", "a-6", None),
    ("events", "erin", "e-4", None),
    ("orders", "", "o-5", None),
]
# audit gave up on a-2: its dead-letter copy, sequenced at position 36 (the log head).
DEAD_LETTER = ("orders_dlq", "alice", "a-2", 36)
LAST_POSITION = 36

# 0002's queue_offsets: (group, topic, key) -> watermark (a position). A key without a row
# has watermark 0. heidi and eu have no messages left (collected), only watermarks.
WATERMARKS = {
    ("ledger", "orders", "alice"): 12, ("ledger", "orders", "carol"): 9,
    ("ledger", "orders", "bob"): 14, ("ledger", "orders", "dave"): 5,
    ("ledger", "orders", "heidi"): 30, ("ledger", "orders", "frank"): 13,
    ("ledger", "orders", "eu"): 33, ("ledger", "orders", ""): 10,
    ("ledger", "slow", "ivan"): 23, ("ledger", "slow", "judy"): 24, ("ledger", "slow", ""): 19,
    ("ledger", "events", "erin"): 28, ("ledger", "events", ""): 30,
    ("audit", "orders", "alice"): 31, ("audit", "orders", "carol"): 15,
    ("audit", "orders", "bob"): 26, ("audit", "orders", "dave"): 11, ("audit", "orders", ""): 25,
    ("audit", "slow", "ivan"): 27, ("audit", "slow", "judy"): 18, ("audit", "slow", ""): 26,
    ("audit", "events", "erin"): 21, ("audit", "events", "grace"): 29,
}

# 0002's queue_delivery_state, by message: (group, topic, key, id, acked, invisible_until,
# retry_count, last_error). a-4 was in flight (third delivery), g-2 nacked; a-5 and e-3 were
# acked above their key's watermark, b-2 and b-3 below it (rows not yet cleaned up).
DELIVERIES = [
    ("ledger", "orders", "alice", "a-4", False, 1_500, 2, ""),
    ("ledger", "orders", "alice", "a-5", True, 0, 0, ""),
    ("ledger", "orders", "bob", "b-2", True, 0, 0, ""),
    ("audit", "orders", "bob", "b-3", True, 0, 0, ""),
    ("audit", "events", "grace", "g-2", False, 2_500, 1, "ValueError: boom"),
    ("audit", "events", "erin", "e-3", True, 0, 0, ""),
]
# A row whose message was garbage-collected: (group, topic, key, offset).
ORPHAN_DELIVERY = ("ledger", "orders", "alice", 10**12)

# 0002's per-key leases: (group, topic, key, leased_by, leased_at, renewed_at, generation).
# "idle" has no messages: only its lease row names it.
LEASES = [
    ("ledger", "orders", "alice", "old-host:1", 900, 1_000, 3),
    ("ledger", "orders", "", "", 0, 0, 1),
    ("audit", "slow", "judy", "old-host:2", 900, 1_000, 2),
    ("audit", "idle", "k", "", 0, 0, 0),
]
# Workers long gone: (group, topic, name, heartbeat_at, deregistered_at).
HEARTBEATS = [
    ("ledger", "orders", "old-host:1", 1_000, 0),
    ("audit", "slow", "old-host:2", 1_000, 2_000),
]


def partition_of(topic: str, key: str, offset: int) -> str:
    """Where 0003 must put a message: crc32 of its key, or its offset when it has none."""
    if key:
        return str(zlib.crc32(key.encode("utf-8")) % COUNTS[topic])
    return str(offset % COUNTS[topic])


@dataclass(frozen=True)
class Msg:
    offset: int
    topic: str
    key: str
    id: str
    position: int | None

    @property
    def partition(self) -> str:
        return partition_of(self.topic, self.key, self.offset)


@dataclass
class OldLog:
    """The 0002 rows as inserted, with their offsets."""

    messages: list[Msg]
    acked_rows: set[tuple[str, int]]  # (group, offset) of acked delivery rows

    def by_id(self, topic: str, key: str, message_id: str) -> Msg:
        [message] = [m for m in self.messages
                     if (m.topic, m.key, m.id) == (topic, key, message_id)]
        return message

    def was_acked(self, group: str, message: Msg) -> bool:
        """Acked under 0002: at or below its key's watermark, or by an acked delivery row."""
        mark = WATERMARKS.get((group, message.topic, message.key), 0)
        return ((message.position is not None and message.position <= mark)
                or (group, message.offset) in self.acked_rows)


# --------------------------------------------------------------------------- schema


def latest_targets() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes(APP)


def migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)


def rebuild_schema_at(targets: list[tuple[str, str]]) -> None:
    """Drop the app's tables, forget its migrations and migrate from nothing to ``targets``."""
    with connection.cursor() as cursor:
        existing = set(connection.introspection.table_names(cursor))
    with connection.schema_editor() as editor:
        for table in TABLES:
            if table in existing:
                editor.execute(f"DROP TABLE {editor.quote_name(table)}")
    recorder = MigrationRecorder(connection)
    for app, name in list(recorder.applied_migrations()):
        if app == APP:
            recorder.record_unapplied(app, name)
    migrate(targets)


def migrate_to_latest() -> None:
    migrate(latest_targets())


def restore_latest() -> None:
    """Leave the database at the latest migration, whatever state a failed test left."""
    targets = latest_targets()
    if not MigrationExecutor(connection).migration_plan(targets):
        return
    try:
        migrate(targets)
    except Exception:
        rebuild_schema_at(targets)


# --------------------------------------------------------------------------- the 0002 data


def insert_old_rows() -> OldLog:
    q = connection.ops.quote_name
    json_param = "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"
    columns = ", ".join(q(c) for c in (
        "topic", "partition_key", "id", "payload", "metadata", "failed_at", "failure_count",
        "last_error", "original_topic", "original_offset", "consumer_group", "created_at",
        "published_at", "deliver_at", "position",
    ))
    message_sql = (
        f"INSERT INTO {q('queue_messages')} ({columns}) VALUES "
        f"(%s, %s, %s, {json_param}, {json_param}, %s, %s, %s, %s, %s, %s, 1000, 1000, 1000, %s)"
    )

    def offsets() -> dict[tuple[str, str, str], int]:
        cursor.execute(f"SELECT {q('topic')}, {q('partition_key')}, {q('id')}, {q('offset')} "
                       f"FROM {q('queue_messages')}")
        return {(t, k, i): int(o) for t, k, i, o in cursor.fetchall()}

    with connection.cursor() as cursor:
        for n, (topic, key, message_id, position) in enumerate(LOG):
            cursor.execute(message_sql, [topic, key, message_id, f'{{"n": {n}}}', "{}", 0, 0, "",
                                         "", 0, "", position])
        dlq_topic, key, original_id, position = DEAD_LETTER
        original = offsets()[("orders", key, original_id)]
        cursor.execute(message_sql, [dlq_topic, key, f"audit:{original}", '{"n": "dead"}', "{}",
                                     1_000, 5, "RuntimeError: gave up", "orders", original,
                                     "audit", position])
        cursor.execute(
            f"INSERT INTO {q('queue_sequencer')} ({q('name')}, {q('last_position')}, "
            f"{q('sequenced_by')}, {q('sequenced_at')}) VALUES ('default', %s, 'old-host:1', 1000)",
            [LAST_POSITION],
        )
        stored = offsets()
        for (group, topic, key), mark in WATERMARKS.items():
            cursor.execute(
                f"INSERT INTO {q('queue_offsets')} ({q('consumer_group')}, {q('topic')}, "
                f"{q('partition_key')}, {q('offset_acked')}, {q('updated_at')}) "
                f"VALUES (%s, %s, %s, %s, 1000)", [group, topic, key, mark],
            )
        delivery_sql = (
            f"INSERT INTO {q('queue_delivery_state')} ({q('consumer_group')}, {q('topic')}, "
            f"{q('partition_key')}, {q('message_offset')}, {q('acked')}, {q('invisible_until')}, "
            f"{q('retry_count')}, {q('last_error')}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
        )
        for group, topic, key, message_id, acked, until, retries, error in DELIVERIES:
            cursor.execute(delivery_sql, [group, topic, key, stored[(topic, key, message_id)],
                                          acked, until, retries, error])
        cursor.execute(delivery_sql, [*ORPHAN_DELIVERY, True, 0, 0, ""])
        for lease in LEASES:
            cursor.execute(
                f"INSERT INTO {q('queue_partition_leases')} ({q('consumer_group')}, {q('topic')}, "
                f"{q('partition_key')}, {q('leased_by')}, {q('leased_at')}, "
                f"{q('lease_renewed_at')}, {q('generation')}) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                list(lease),
            )
        for beat in HEARTBEATS:
            cursor.execute(
                f"INSERT INTO {q('queue_subscriber_heartbeats')} ({q('consumer_group')}, "
                f"{q('topic')}, {q('subscriber_name')}, {q('heartbeat_at')}, "
                f"{q('deregistered_at')}) VALUES (%s, %s, %s, %s, %s)",
                list(beat),
            )
        cursor.execute(f"SELECT {q('offset')}, {q('topic')}, {q('partition_key')}, {q('id')}, "
                       f"{q('position')} FROM {q('queue_messages')} ORDER BY {q('offset')}")
        messages = [Msg(int(o), t, k, i, None if p is None else int(p))
                    for o, t, k, i, p in cursor.fetchall()]
    acked_rows = {(group, stored[(topic, key, message_id)])
                  for group, topic, key, message_id, acked, *_ in DELIVERIES if acked}
    return OldLog(messages, acked_rows)


@pytest.fixture
def old_log(transactional_db) -> Iterator[OldLog]:
    """A database at 0002 holding the old-shaped rows; left at the latest migration."""
    try:
        rebuild_schema_at([OLD])
        yield insert_old_rows()
    finally:
        restore_latest()


# --------------------------------------------------------------------------- expectations


def expected_watermark(log: OldLog, group: str, topic: str, partition: str) -> int:
    """The lowest old watermark among the partition's keys with messages above it, else the
    highest of its keys' watermarks (keys with messages there, or keys mapping there)."""
    marks = {key: mark for (g, t, key), mark in WATERMARKS.items() if (g, t) == (group, topic)}
    sequenced = [(m.key, m.position) for m in log.messages
                 if m.topic == topic and m.partition == partition and m.position is not None]
    keys = {key for key, _ in sequenced}
    keys |= {key for key in marks if key and partition_of(topic, key, 0) == partition}
    behind = {key for key, position in sequenced if position > marks.get(key, 0)}
    if behind:
        return min(marks.get(key, 0) for key in behind)
    return max((marks.get(key, 0) for key in keys), default=0)


def old_subscriptions() -> set[tuple[str, str]]:
    return {(group, topic) for group, topic, _ in WATERMARKS}


def new_watermarks() -> dict[tuple[str, str, str], int]:
    return {(g, t, p): mark for g, t, p, mark in ConsumerOffset.objects.values_list(
        "consumer_group", "topic", "partition_key", "offset_acked")}


def acked_rows_after() -> set[tuple[str, int]]:
    return set(DeliveryState.objects.filter(acked=True).values_list(
        "consumer_group", "message_offset"))


def positions() -> dict[int, int]:
    return {offset: position for offset, position in QueueMessage.objects.values_list(
        "offset", "position") if position is not None}


# --------------------------------------------------------------------------- messages


def test_every_message_keeps_its_key_and_gets_its_partition(old_log):
    migrate_to_latest()

    rows = {o: (t, k, p) for o, t, k, p in QueueMessage.objects.values_list(
        "offset", "topic", "message_key", "partition_key")}
    assert rows == {m.offset: (m.topic, m.key, m.partition) for m in old_log.messages}


def test_messages_are_converted_batch_by_batch(old_log, monkeypatch):
    monkeypatch.setattr(import_module(f"{APP}.migrations.0003_partitions"), "BATCH", 7)

    migrate_to_latest()

    assert dict(QueueMessage.objects.values_list("offset", "partition_key")) == {
        m.offset: m.partition for m in old_log.messages}


def test_each_topic_records_its_configured_partition_count(old_log):
    migrate_to_latest()

    assert dict(Topic.objects.values_list("topic", "partitions")) == COUNTS


def test_two_keys_of_one_partition_keep_their_shared_id(old_log):
    migrate_to_latest()

    rows = QueueMessage.objects.filter(topic="orders", message_id="same-id")
    assert sorted(rows.values_list("message_key", "partition_key")) == [
        ("alice", "11"), ("carol", "11")]


def test_the_idempotency_constraint_is_topic_message_key_and_id(old_log):
    migrate_to_latest()

    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "queue_messages")
    unique = [(name, info["columns"]) for name, info in constraints.items()
              if info["unique"] and not info["primary_key"]]
    assert unique == [("queue_msg_key_idempotency", ["topic", "message_key", "id"])]
    QueueMessageFactory(topic="orders", partition_key="11", message_key="alice", message_id="x")
    QueueMessageFactory(topic="orders", partition_key="11", message_key="carol", message_id="x")
    with pytest.raises(IntegrityError), transaction.atomic():
        QueueMessageFactory(topic="orders", partition_key="11", message_key="alice",
                            message_id="x")


def test_the_dead_letter_copy_keeps_its_origin(old_log):
    migrate_to_latest()

    copy = QueueMessage.objects.get(topic="orders_dlq")
    original = old_log.by_id("orders", "alice", "a-2")
    assert (copy.message_key, copy.partition_key, copy.message_id) == (
        "alice", "3", f"audit:{original.offset}")
    assert (copy.consumer_group, copy.original_topic, copy.original_offset, copy.failure_count,
            copy.last_error, copy.position) == (
        "audit", "orders", original.offset, 5, "RuntimeError: gave up", 36)


# --------------------------------------------------------------------------- watermarks


def test_each_subscription_gets_one_watermark_row_per_partition(old_log):
    migrate_to_latest()

    assert set(new_watermarks()) == {
        (group, topic, str(p)) for group, topic in old_subscriptions()
        for p in range(COUNTS[topic])
    }


def test_a_partition_watermark_is_its_lowest_unfinished_key_watermark_else_its_highest(old_log):
    migrate_to_latest()

    assert new_watermarks() == {
        (group, topic, str(p)): expected_watermark(old_log, group, topic, str(p))
        for group, topic in old_subscriptions() for p in range(COUNTS[topic])
    }


def test_one_partition_topic_merges_its_keys_at_the_lowest_unfinished_watermark(old_log):
    migrate_to_latest()

    # ledger: ivan (23) and keyless (19) have messages above their watermark, judy (24) has
    # only an unsequenced one. audit: only judy (18) is unfinished.
    assert new_watermarks()[("ledger", "slow", "0")] == 19
    assert new_watermarks()[("audit", "slow", "0")] == 18


def test_the_read_cursor_starts_at_the_watermark(old_log):
    migrate_to_latest()

    rows = ConsumerOffset.objects.values_list("offset_acked", "offset_fetched")
    assert rows and all(acked == fetched for acked, fetched in rows)


def test_no_message_acked_before_is_unacked_after(old_log):
    migrate_to_latest()

    marks, acked_rows = new_watermarks(), acked_rows_after()
    unacked = [
        (group, m) for group, topic in sorted(old_subscriptions()) for m in old_log.messages
        if m.topic == topic and old_log.was_acked(group, m)
        and not ((m.position is not None and m.position <= marks[(group, topic, m.partition)])
                 or (group, m.offset) in acked_rows)
    ]
    assert unacked == []


def test_no_message_unacked_before_is_acked_after(old_log):
    migrate_to_latest()

    marks, acked_rows = new_watermarks(), acked_rows_after()
    acked = [
        (group, m) for group, topic in sorted(old_subscriptions()) for m in old_log.messages
        if m.topic == topic and not old_log.was_acked(group, m)
        and ((m.position is not None and m.position <= marks[(group, topic, m.partition)])
             or (group, m.offset) in acked_rows)
    ]
    assert acked == []


# --------------------------------------------------------------------------- delivery rows


def test_unacked_delivery_rows_keep_their_state_in_the_new_partition(old_log):
    in_flight = old_log.by_id("orders", "alice", "a-4")
    nacked = old_log.by_id("events", "grace", "g-2")

    migrate_to_latest()

    rows = DeliveryState.objects.filter(acked=False).values_list(
        "consumer_group", "topic", "partition_key", "message_offset", "retry_count",
        "last_error", "invisible_until")
    assert sorted(rows) == sorted([
        ("ledger", "orders", in_flight.partition, in_flight.offset, 2, "", 1_500),
        ("audit", "events", nacked.partition, nacked.offset, 1, "ValueError: boom", 2_500),
    ])


def test_every_delivery_row_is_in_its_messages_partition(old_log):
    migrate_to_latest()

    where = {m.offset: (m.topic, m.partition) for m in old_log.messages}
    rows = DeliveryState.objects.values_list("message_offset", "topic", "partition_key")
    assert rows.exists()
    assert [row for row in rows if where.get(row[0]) != row[1:]] == []


def test_delivery_rows_of_collected_messages_are_dropped(old_log):
    migrate_to_latest()

    assert not DeliveryState.objects.filter(message_offset=ORPHAN_DELIVERY[3]).exists()


# --------------------------------------------------------------------------- leases, heartbeats


def test_old_per_key_lease_rows_are_dropped(old_log):
    migrate_to_latest()

    assert not PartitionLease.objects.exists()


def test_heartbeats_are_kept(old_log):
    migrate_to_latest()

    assert sorted(SubscriberHeartbeat.objects.values_list(
        "consumer_group", "topic", "subscriber_name", "heartbeat_at", "deregistered_at",
    )) == sorted(HEARTBEATS)


# --------------------------------------------------------------------------- consuming after


@pytest.fixture
def handled() -> Iterator[list[tuple[str, str, str, int, int]]]:
    """Subscribe both groups to every consumed topic, strictly ordered per key; yields the
    (group, topic, key, offset, attempt) of every handler run, in the order they ran."""
    runs: list[tuple[str, str, str, int, int]] = []

    def handle(message: sqlqueue.Message) -> None:
        runs.append((message.group, message.topic, message.key, message.offset,
                     message.attempt))

    try:
        for topic in CONSUMED:
            for group in GROUPS:
                sqlqueue.subscriber(topic, group=group, batch_size=1)(handle)
        yield runs
    finally:
        for topic in CONSUMED:
            for group in GROUPS:
                unregister(topic, group)


def run_burst(subs: list[Subscription]) -> None:
    assert Worker(subs, name="after-migration", burst=True).run() == 0


def test_after_migrating_each_group_handles_exactly_what_it_had_not_acked_in_key_order(
        old_log, handled):
    migrate_to_latest()

    run_burst([s for s in subscriptions() if s.group in GROUPS and s.topic in CONSUMED])

    position = positions()
    for group in GROUPS:
        runs = [(topic, key, offset) for g, topic, key, offset, _ in handled if g == group]
        offsets = [offset for _, _, offset in runs]
        assert [o for o, n in Counter(offsets).items() if n > 1] == [], f"{group}: twice"
        assert sorted(offsets) == sorted(
            m.offset for m in old_log.messages
            if m.topic in CONSUMED and not old_log.was_acked(group, m)
        ), group
        by_key: dict[tuple[str, str], list[int]] = {}
        for topic, key, offset in runs:
            if key:
                by_key.setdefault((topic, key), []).append(offset)
        for (topic, key), order in by_key.items():
            assert order == sorted(order, key=lambda o: position[o]), (group, topic, key)


def test_after_migrating_a_redelivery_continues_the_old_attempt_count(old_log, handled):
    in_flight = old_log.by_id("orders", "alice", "a-4")
    nacked = old_log.by_id("events", "grace", "g-2")
    migrate_to_latest()

    run_burst([s for s in subscriptions() if s.group in GROUPS and s.topic in CONSUMED])

    attempts = {(g, o): a for g, _, _, o, a in handled}
    # retry_count 2: delivered three times before; retry_count 1: twice.
    assert attempts[("ledger", in_flight.offset)] == 4
    assert attempts[("audit", nacked.offset)] == 3
