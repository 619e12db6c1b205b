"""The limits' rows: slots free when given back or expired, a slot taken over is not given
back by its old holder, and rows of idle keys are deleted (cost follows the keys running)."""

from __future__ import annotations

import pytest

from django_sqlqueue.models import LimitBucket, LimitSlot
from django_sqlqueue.models.limit_slots import key_digest
from django_sqlqueue.operations.names import database_now_ms

pytestmark = pytest.mark.django_db

SCOPE = "limits:rows"


def now() -> int:
    return database_now_ms("default")


def take(key: str, holder: str, expires_at: int, count: int = 2) -> int:
    LimitSlot.objects.ensure(SCOPE, key, count, now(), "default")
    row_id, _ = LimitSlot.objects.lock_free(SCOPE, key, count, 1, now(), "default")[0]
    LimitSlot.objects.take(row_id, holder, "t/0@1", expires_at, "default")
    return row_id


def test_a_taken_slot_is_not_free_until_given_back():
    row_id = take("", "worker-a", now() + 60_000, count=1)
    assert LimitSlot.objects.lock_free(SCOPE, "", 1, 1, now(), "default") == []

    LimitSlot.objects.give_back([row_id], "worker-a", now(), "default")

    assert [r for r, _ in LimitSlot.objects.lock_free(SCOPE, "", 1, 1, now(), "default")] == [row_id]


def test_a_slot_whose_holder_stopped_renewing_is_free_again():
    row_id = take("", "crashed", now() - 1, count=1)

    assert [r for r, _ in LimitSlot.objects.lock_free(SCOPE, "", 1, 1, now(), "default")] == [row_id]


def test_the_old_holder_does_not_give_back_a_slot_taken_over():
    row_id = take("", "crashed", now() - 1, count=1)
    LimitSlot.objects.take(row_id, "worker-b", "t/0@2", now() + 60_000, "default")

    assert LimitSlot.objects.give_back([row_id], "crashed", now(), "default") == 0
    assert LimitSlot.objects.get(id=row_id).holder == "worker-b"


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
