"""A poll cycle that rolls back (a deadlock, say) is tried again with the same outcomes:
the task's result must still be recorded then, never left RUNNING while its message is
acked."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.db import transaction
from django.utils import timezone

from django_sqlqueue.consuming.message import Message
from django_sqlqueue.models import QueueMessage, TaskResultRecord
from django_sqlqueue.tasks.runner import TaskRunner
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Recorded:
    message: Message


class CycleRolledBack(Exception):
    pass


def delivered(result_id: str) -> Message:
    row = QueueMessage.objects.get(payload__id=result_id)
    return Message(topic=row.topic, key=row.message_key, id=row.message_id, offset=row.offset,
                   payload=row.payload, headers={}, published_at=timezone.now(), attempt=1)


def test_a_result_is_recorded_when_the_cycle_recording_it_is_tried_again():
    result = tasks.add.enqueue(2, 3)
    message = delivered(result.id)
    runner = TaskRunner("w1")
    with transaction.atomic():
        runner.handed_out([message], "default")
    runner(message)  # the handler thread runs the task

    with pytest.raises(CycleRolledBack), transaction.atomic():
        runner.recorded([Recorded(message)], "default")
        raise CycleRolledBack  # the cycle's transaction fails after recording
    assert TaskResultRecord.objects.get(id=result.id).status == "RUNNING"

    with transaction.atomic():  # the cycle, tried again
        runner.recorded([Recorded(message)], "default")

    row = TaskResultRecord.objects.get(id=result.id)
    assert (row.status, row.return_value) == ("SUCCESSFUL", 5)
