"""A transaction's messages are positioned in publish order, whatever commits while the
sequencer reads the log.

The hazard is InnoDB's: a locking scan with SKIP LOCKED checks row locks one row at a time,
so a scan that passes a transaction's first messages while it is open, and reaches its later
ones after it committed, would take only the later ones (a sequencer that read the log that
way split 4 to 10 of these 20 transactions on MariaDB). Another open transaction's messages
between the two halves of a key's transaction (two requests publishing at once) make such a
scan long enough to be caught in the act on every run. PostgreSQL reads each statement from
one snapshot and SQLite has a single writer, so neither could split a transaction that way;
the test runs there too, without the interleaved transaction on SQLite, whose single writer
would make it wait for the key's transaction.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

import django_sqlqueue as sqlqueue
from django_sqlqueue.sequencing import sequence_all, sequence_pending
from django_sqlqueue.store.messages import INSERT_COLUMNS
from tests.helpers import outcomes, positions_by_offset, start_thread

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = 20
PER_KEY = 1000  # 20,000 messages in all
INTERLEAVED = 1500  # messages of the other, still open transaction between a key's halves
SETTLE = 0.005  # seconds a key's transaction stays open after its last publish


def _insert_interleaved() -> None:
    """INTERLEAVED uncommitted messages, copied in the database from the committed seed
    (publishing them one by one would cost more than the rest of the test)."""
    q = connection.ops.quote_name
    values = {column: "0" for column in INSERT_COLUMNS}
    values.update({"topic": "'interleaved'", "message_key": q("message_key"),
                   "partition_key": "''", "id": q("id"), "payload": q("payload"),
                   "metadata": q("metadata"), "last_error": "''", "original_topic": "''",
                   "consumer_group": "''"})
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {q('queue_messages')} ({', '.join(q(c) for c in values)}) "  # noqa: S608 - test constants
            f"SELECT {', '.join(values.values())} FROM {q('queue_messages')} "
            f"WHERE {q('topic')} = 'seed'"
        )


def test_a_transactions_messages_keep_publish_order_while_a_sequencer_loops():
    interleave = connection.vendor != "sqlite"
    if interleave:
        sqlqueue.publish_many("seed", [{"payload": n} for n in range(INTERLEAVED)])
    stop = threading.Event()
    want_interleaved = threading.Event()
    interleaved = threading.Event()
    key_committed = threading.Event()

    def sequencer() -> int:
        rounds = 0
        while not stop.is_set():
            sequence_pending(sequenced_by="looping")
            rounds += 1
        return rounds

    def other_transaction() -> None:
        # Opened between the two halves of each key's transaction, rolled back after it.
        while want_interleaved.wait(30) and not stop.is_set():
            want_interleaved.clear()
            with transaction.atomic():
                _insert_interleaved()
                interleaved.set()
                key_committed.wait(30)
                key_committed.clear()
                transaction.set_rollback(True)

    threads = [start_thread(sequencer, name="sequencer")]
    if interleave:
        threads.append(start_thread(other_transaction, name="other-transaction"))
    published: list[list[int]] = []
    try:
        for n in range(KEYS):
            messages = [{"payload": i, "key": f"key-{n}"} for i in range(PER_KEY)]
            with transaction.atomic():
                first = sqlqueue.publish_many("ordered", messages[:PER_KEY // 2])
                if interleave:
                    want_interleaved.set()
                    assert interleaved.wait(30)
                    interleaved.clear()
                rest = sqlqueue.publish_many("ordered", messages[PER_KEY // 2:])
                time.sleep(SETTLE)
            key_committed.set()
            published.append([m.offset for m in first + rest])
    finally:
        stop.set()
        want_interleaved.set()
        key_committed.set()
    rounds = outcomes(threads)[0]
    sequence_all()

    positions = positions_by_offset()
    inverted = [offsets for offsets in published
                if [positions[o] for o in offsets] != sorted(positions[o] for o in offsets)]
    assert sum(len(offsets) for offsets in published) == KEYS * PER_KEY
    if connection.vendor != "sqlite":
        assert rounds > KEYS  # the sequencer really ran between the transactions
    # SQLite: one writer at a time, so a publisher's transaction holds the sequencer back
    # (on a loaded machine for the whole run); commits cannot interleave, and the order
    # below is what must hold there.
    assert len(inverted) == 0, f"{len(inverted)} of {KEYS} transactions positioned out of order"
