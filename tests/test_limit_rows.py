"""The limits' rows: slots free when given back or expired, a slot taken over is not given
back by its old holder, and rows of idle keys are deleted (cost follows the keys running)."""

from __future__ import annotations

import pytest

from django_sqlqueue.models import LimitBucket, LimitSlot
from django_sqlqueue.models.limit_slots import RESERVED_MS, key_digest
from django_sqlqueue.operations.names import database_now_ms

pytestmark = pytest.mark.django_db

SCOPE = "limits:rows"


def now() -> int:
    return database_now_ms("default")


def take(key: str, holder: str, expires_at: int, count: int = 2, at: int | None = None) -> int:
    LimitSlot.objects.ensure(SCOPE, key, count, now(), "default")
    row_id, _ = LimitSlot.objects.lock_free(SCOPE, key, count, 1, now(), "default",
                                            holder=holder)[0]
    LimitSlot.objects.take(row_id, holder, "t/0@1", expires_at, now() if at is None else at,
                           "default")
    return row_id


def test_a_taken_slot_is_not_free_until_given_back():
    row_id = take("", "worker-a", now() + 60_000, count=1)
    assert LimitSlot.objects.lock_free(SCOPE, "", 1, 1, now(), "default") == []

    LimitSlot.objects.give_back([row_id], "worker-a", now(), "default")

    assert [r for r, _ in LimitSlot.objects.lock_free(SCOPE, "", 1, 1, now(), "default")] == [row_id]


def test_a_slot_whose_holder_stopped_renewing_is_free_again():
    row_id = take("", "crashed", now() - 1, count=1)

    assert [r for r, _ in LimitSlot.objects.lock_free(SCOPE, "", 1, 1, now(), "default")] == [row_id]


def test_a_worker_never_holds_again_a_row_it_lost_while_its_handler_runs():
    # A's lease ran out while its handler ran; B took the slot and gave it back. A must not
    # take it again before that handler ends: its end gives the row back.
    row_id = take("", "worker-a", now() - 1, count=1)
    LimitSlot.objects.take(row_id, "worker-b", "t/0@2", now() + 60_000, now(), "default")
    LimitSlot.objects.give_back([row_id], "worker-b", now(), "default")

    assert LimitSlot.objects.lock_free(SCOPE, "", 1, 1, now(), "default", holder="worker-a",
                                       still_used=[row_id]) == []
    assert [r for r, _ in LimitSlot.objects.lock_free(
        SCOPE, "", 1, 1, now(), "default", holder="worker-c")] == [row_id]


def test_the_old_holder_does_not_give_back_a_slot_taken_over():
    row_id = take("", "crashed", now() - 1, count=1)
    LimitSlot.objects.take(row_id, "worker-b", "t/0@2", now() + 60_000, now(), "default")

    assert LimitSlot.objects.give_back([row_id], "crashed", now(), "default") == 0
    assert LimitSlot.objects.get(id=row_id).holder == "worker-b"


def test_a_waiting_worker_asks_for_the_slot_held_longest():
    newer = take("", "worker-a", now() + 60_000, count=3, at=now())
    older = take("", "worker-b", now() + 60_000, count=3, at=now() - 5_000)
    take("", "worker-c", now() + 60_000, count=3, at=now() - 1_000)

    assert LimitSlot.objects.want(SCOPE, "", 3, "worker-d", now(), now(), "default") == 1

    assert LimitSlot.objects.wanted([older, newer], "worker-b", "default") == [older]
    assert LimitSlot.objects.get(id=older).wanted_by == "worker-d"


def test_each_waiting_worker_asks_for_one_slot_at_a_time():
    base = now()
    rows = [take("", f"worker-{n}", base + 60_000, count=3, at=base - 1_000 * n)
            for n in range(3)]

    assert LimitSlot.objects.want(SCOPE, "", 3, "worker-x", base, base, "default") == 1
    assert LimitSlot.objects.want(SCOPE, "", 3, "worker-x", base, base, "default") == 0
    assert LimitSlot.objects.want(SCOPE, "", 3, "worker-y", base, base, "default") == 1

    asked = dict(LimitSlot.objects.filter(id__in=rows).exclude(wanted_by="")
                 .values_list("wanted_by", "id"))
    assert asked == {"worker-x": rows[2], "worker-y": rows[1]}


def test_a_slot_given_back_when_asked_for_waits_a_moment_for_the_asker():
    row_id = take("", "worker-a", now() + 60_000, count=1)
    LimitSlot.objects.want(SCOPE, "", 1, "worker-b", now(), now(), "default")
    LimitSlot.objects.give_back([row_id], "worker-a", now(), "default")

    assert LimitSlot.objects.lock_free(SCOPE, "", 1, 1, now(), "default", holder="worker-c") == []
    assert [r for r, _ in LimitSlot.objects.lock_free(
        SCOPE, "", 1, 1, now(), "default", holder="worker-b")] == [row_id]
    # An asker that never came: the slot is everyone's again after the reservation.
    later = now() + RESERVED_MS + 1
    assert [r for r, _ in LimitSlot.objects.lock_free(
        SCOPE, "", 1, 1, later, "default", holder="worker-c")] == [row_id]
    assert LimitSlot.objects.want(SCOPE, "", 1, "worker-b", later, later, "default") == 0


def test_a_worker_served_otherwise_withdraws_its_ask():
    row_id = take("", "worker-a", now() + 60_000, count=2)
    LimitSlot.objects.want(SCOPE, "", 2, "worker-b", now(), now(), "default")

    LimitSlot.objects.unwant(SCOPE, "", "worker-b", "default")

    assert LimitSlot.objects.wanted([row_id], "worker-a", "default") == []
    assert LimitSlot.objects.want(SCOPE, "", 2, "worker-b", now(), now(), "default") == 1


def test_the_worker_waiting_longest_takes_over_the_ask():
    row_id = take("", "worker-a", now() + 60_000, count=1)
    base = now()
    assert LimitSlot.objects.want(SCOPE, "", 1, "worker-late", base, base, "default") == 1

    # A worker waiting since earlier takes the ask over; one waiting since later does not.
    assert LimitSlot.objects.want(SCOPE, "", 1, "worker-early", base - 2_000, base,
                                  "default") == 1
    assert LimitSlot.objects.want(SCOPE, "", 1, "worker-late", base, base + 200,
                                  "default") == 0
    assert LimitSlot.objects.get(id=row_id).wanted_by == "worker-early"


def test_renewing_pushes_back_only_the_holders_own_slots():
    mine = take("", "worker-a", now() + 1_000)
    theirs = take("", "worker-b", now() + 1_000)

    LimitSlot.objects.renew([mine, theirs], "worker-a", now() + 60_000, "default")

    assert LimitSlot.objects.get(id=mine).expires_at > now() + 30_000
    assert LimitSlot.objects.get(id=theirs).expires_at < now() + 30_000


def test_rows_of_idle_keys_are_deleted_and_running_keys_kept():
    take("running", "worker-a", now() + 60_000)
    LimitSlot.objects.ensure(SCOPE, "idle", 2, now() - 60_000, "default")
    take("", "worker-a", now() + 60_000)

    LimitSlot.objects.sweep(now() - 30_000, "default")

    left = set(LimitSlot.objects.values_list("limit_key", flat=True))
    assert key_digest("idle") not in left
    assert {key_digest("running"), ""} <= left
    # The running key keeps its held slot; its free one is young and kept too.
    assert LimitSlot.objects.filter(limit_key=key_digest("running")).count() == 2


def test_a_per_key_bucket_full_again_is_deleted():
    for key in ("busy", "quiet"):
        bucket = LimitBucket.objects.lock(SCOPE, key, "10/s", 10, 0.01, now(), "default")
        assert bucket is not None
        bucket.tokens = 0 if key == "busy" else 10
        LimitBucket.objects.save_tokens(bucket, 10, 0.01, now() - (0 if key == "busy" else 5_000),
                                        "default")

    LimitBucket.objects.sweep(now(), "default")

    assert list(LimitBucket.objects.values_list("key_label", flat=True)) == ["busy"]


def test_a_missing_bucket_starts_full():
    bucket = LimitBucket.objects.lock(SCOPE, "", "5/s", 5, 0.005, now(), "default")

    assert bucket is not None and bucket.tokens == 5
