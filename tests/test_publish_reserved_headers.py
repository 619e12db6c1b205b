"""Header names starting with ``sqlqueue-`` are the queue's own: a publisher cannot set
them, so no publisher can make a consumer group pass over a message. Only a replay of a dead
letter carries them, and it still reaches exactly the group that failed the message."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import transaction

import django_sqlqueue as sqlqueue
from django_sqlqueue import operations as ops
from django_sqlqueue.consuming.registry import Subscription, subscriptions, unregister
from django_sqlqueue.models import QueueMessage
from django_sqlqueue.replays import GROUP_HEADER, ORIGINAL_ID_HEADER
from django_sqlqueue.worker.process import Worker

RESERVED = ["sqlqueue-replay-group", "sqlqueue-original-id", "sqlqueue-anything-else",
            "SQLQueue-Replay-Group"]
TOPIC = "reserved"


@pytest.mark.django_db
@pytest.mark.parametrize("name", RESERVED)
def test_publish_refuses_a_reserved_header_naming_it_and_writes_nothing(name):
    with transaction.atomic():
        with pytest.raises(sqlqueue.InvalidMessage, match=f"header '{name}' is reserved"):
            sqlqueue.publish("orders", {"n": 1}, key="k", headers={name: "billing"})
        # The caller's transaction is still usable.
        kept = sqlqueue.publish("orders", {"n": 2}, key="k", headers={"trace": "t-1"})

    assert list(QueueMessage.objects.values_list("offset", "metadata")) == \
        [(kept.offset, {"trace": "t-1"})]


@pytest.mark.django_db
def test_publish_many_refuses_a_reserved_header_and_writes_none_of_the_messages():
    messages = [{"payload": 1, "key": "k"},
                {"payload": 2, "key": "k", "headers": {GROUP_HEADER: "billing"}}]
    with transaction.atomic():
        with pytest.raises(sqlqueue.InvalidMessage,
                           match=rf"messages\[1\]: header '{GROUP_HEADER}' is reserved"):
            sqlqueue.publish_many("orders", messages)
        kept = sqlqueue.publish_many("orders", [messages[0]])

    assert list(QueueMessage.objects.values_list("offset", flat=True)) == [kept[0].offset]


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["sqlqueue", "x-sqlqueue-replay-group", "replay-group"])
def test_names_that_only_resemble_the_prefix_are_published(name):
    stored = sqlqueue.publish("orders", {}, headers={name: "v"})

    assert stored.headers == {name: "v"}


# --------------------------------------------------------------------------- replays


@pytest.fixture
def two_groups() -> Iterator[tuple[list[Subscription], dict[str, list[str]]]]:
    """``billing`` fails the message while ``failing`` holds; ``shipping`` never fails."""
    handled: dict[str, list[str]] = {"billing": [], "shipping": []}
    failing = {"billing": True}

    @sqlqueue.subscriber(TOPIC, group="billing", max_attempts=1)
    def billing(message: sqlqueue.Message) -> None:
        if failing["billing"]:
            raise sqlqueue.DeadLetter("card declined")
        handled["billing"].append(message.id)

    @sqlqueue.subscriber(TOPIC, group="shipping", max_attempts=1)
    def shipping(message: sqlqueue.Message) -> None:
        handled["shipping"].append(message.id)

    registered = [s for s in subscriptions() if s.topic == TOPIC]
    handled["failing"] = failing  # type: ignore[assignment]
    try:
        yield registered, handled
    finally:
        unregister(TOPIC, "billing")
        unregister(TOPIC, "shipping")


@pytest.mark.django_db(transaction=True)
def test_a_replay_still_reaches_only_the_group_that_failed_it(two_groups):
    registered, handled = two_groups
    sqlqueue.publish(TOPIC, {"order": 42}, key="c-42", id="order-42")
    assert Worker(registered, name="first-run", burst=True).run() == 0
    assert handled["shipping"] == ["order-42"] and handled["billing"] == []

    handled["failing"]["billing"] = False  # type: ignore[index]
    outcome = ops.replay(ops.DeadLetterFilter(topic=TOPIC))
    after = sqlqueue.publish(TOPIC, {"order": 43}, key="c-42", id="order-43",
                             headers={"x-sqlqueue-replay-group": "billing"})
    assert Worker(registered, name="second-run", burst=True).run() == 0

    assert outcome.replayed == 1
    replay = QueueMessage.objects.get(topic=TOPIC, message_id__startswith="replay:")
    assert (replay.metadata[GROUP_HEADER], replay.metadata[ORIGINAL_ID_HEADER]) == \
        ("billing", "order-42")
    assert handled["billing"] == ["order-42", after.id]
    assert handled["shipping"] == ["order-42", after.id]  # passed over the replay


@pytest.mark.django_db(transaction=True)
def test_a_replay_that_fails_again_is_a_plain_dead_letter_for_the_dead_letter_topics_groups(
        two_groups):
    registered, handled = two_groups
    audited: list[tuple[str, str]] = []

    @sqlqueue.subscriber(f"{TOPIC}_dlq", group="audit")
    def audit(message: sqlqueue.Message) -> None:
        assert message.dead_letter is not None
        audited.append((message.dead_letter.original_id, message.dead_letter.group))

    everyone = [*registered, *[s for s in subscriptions() if s.group == "audit"]]
    try:
        sqlqueue.publish(TOPIC, {"order": 42}, key="c-42", id="order-42")
        assert Worker(everyone, name="first-run", burst=True).run() == 0
        assert ops.replay(ops.DeadLetterFilter(topic=TOPIC)).replayed == 1
        assert Worker(everyone, name="replay-fails", burst=True).run() == 0  # billing still fails

        second = QueueMessage.objects.get(topic=f"{TOPIC}_dlq")
        assert GROUP_HEADER not in second.metadata
        assert second.original_id == "order-42"
        # The audit group, consuming the dead-letter topic, handled both copies: the
        # second one is not passed over as if it were billing's replay.
        assert audited == [("order-42", "billing"), ("order-42", "billing")]

        handled["failing"]["billing"] = False  # type: ignore[index]
        assert ops.replay(ops.DeadLetterFilter(topic=TOPIC)).replayed == 1
        assert Worker(everyone, name="fixed", burst=True).run() == 0
        assert handled["billing"] == ["order-42"]  # the id it was published with
        assert handled["shipping"] == ["order-42"]
    finally:
        unregister(f"{TOPIC}_dlq", "audit")
