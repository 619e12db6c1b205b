"""Long handlers: the worker keeps a running handler's message invisible (seed 001's
visibility heartbeat); without that, the message comes back after its visibility timeout."""

from __future__ import annotations

import time

import pytest

import django_sqlqueue as sqlqueue
from tests.testapp.models import Handled
from tests.worker_harness import position_of, wait_until, watermark, worker_pool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


def acked(topic: str, key: str, offset: int) -> bool:
    position = position_of(offset)
    return position is not None and watermark("billing", topic, key) >= position


def runs(topic: str, offset: int) -> list[tuple[int, float]]:
    return list(Handled.objects.filter(topic=topic, offset=offset)
                .order_by("attempt").values_list("attempt", "handled_at"))


def test_a_live_handler_that_outlasts_the_visibility_timeout_is_not_redelivered(workers):
    # "slow" has visibility_timeout=2; the handler runs for 4.5 s.
    message = sqlqueue.publish("slow", {"sleep": 4.5}, key="k")
    worker = workers.start("extend-auto", "--topic", "slow")

    wait_until(lambda: acked("slow", "k", message.offset),
               timeout=20, what="the long handler finishing and its ack", watch=[worker])
    time.sleep(0.3)
    assert [attempt for attempt, _ in runs("slow", message.offset)] == [1]


def test_without_auto_extend_a_long_handlers_message_comes_back_after_the_timeout(workers):
    # "unextended" has visibility_timeout=1 and auto_extend=False.
    message = sqlqueue.publish("unextended", {"sleep": 3}, key="k")
    worker = workers.start("extend-off", "--topic", "unextended")

    wait_until(lambda: len(runs("unextended", message.offset)) >= 2, timeout=20,
               what="the redelivery of a message whose handler is still running", watch=[worker])
    (first, started), (second, restarted) = runs("unextended", message.offset)[:2]
    assert (first, second) == (1, 2)
    assert restarted - started >= 1.0 - 0.05


def test_a_handler_can_extend_its_own_visibility(workers):
    # visibility_timeout=1, auto_extend=False: only the handler's own extension (3 s) keeps
    # the message from coming back while it sleeps 2.5 s.
    message = sqlqueue.publish("extender", {"extend": 3, "sleep": 2.5}, key="k")
    worker = workers.start("extend-own", "--topic", "extender")

    wait_until(lambda: acked("extender", "k", message.offset),
               timeout=20, what="the handler finishing and its ack", watch=[worker])
    assert [attempt for attempt, _ in runs("extender", message.offset)] == [1]
