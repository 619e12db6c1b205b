"""The poison publisher of a chaos run, and what must have become of what it published.

Mixed into the normal traffic, about twice a second, one of:
- a task of ``tasks.py`` enqueued normally (most of them): it must end SUCCESSFUL;
- a task whose outcome cannot be stored as it is (a NUL character, a value over the size
  limit): it must end SUCCESSFUL too, its outcome recorded in a form that says what was
  dropped;
- a message on the task queue's topic that no release of the Tasks backend wrote (a field
  of the wrong type or out of range, an unknown backend or task path, an over-long id, not
  an object at all): it must be dead-lettered with a reason, and the queue goes on;
- a message on the chaos topic whose payload is nested deeper than the queue accepts,
  written past ``publish()``'s check as another version could have: every group must
  dead-letter it (it is flagged poison, so the group reports count it).

Each poison publish is written down (``poison-*.jsonl``) with its offset; :func:`verify`
reads them back after the drain. :func:`cycle_failures` reads the workers' logs for poll
cycles that kept failing: a message must never make its partition's cycles fail for long.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from . import records

TASK_TOPIC = "tasks.chaos"
TASK_GROUP = "tasks"
DEEP_EXTRA = 1  # levels over the accepted depth a deep payload has
# Longest a partition's poll cycles may keep failing (seconds): a database restart makes
# them fail for its few seconds; a message never may for longer.
CYCLE_FAILURE_BOUND = 30.0
CYCLE_FAILED = re.compile(r"^(\S+ \S+) \w+ \S+ poll cycle failed.*? partitions=(\S+)")
STREAK_GAP = 10.0  # seconds between two failures of a partition that still make one streak

# Task payloads no release writes: each is dead-lettered, never retried as a cycle failure.
MALFORMED = {
    "priority": lambda p: {**p, "priority": "high"},
    "run_after": lambda p: {**p, "run_after": "next tuesday"},
    "max_running": lambda p: {**p, "limits": {"key": None, "max_running": 10**8, "rate": None}},
    "rate": lambda p: {**p, "limits": {"key": None, "max_running": None, "rate": ["1/s"]}},
    "id": lambda p: {**p, "id": "x" * 500},
    "backend": lambda p: {**p, "backend": "no-such-backend"},
    "task": lambda p: {**p, "task": "os.getcwd"},
    "args": lambda p: {**p, "args": {"not": "a list"}},
    "not_an_object": lambda p: [p["id"], p["task"]],
}


class PoisonPublisher:
    """What ``publisher.py poison`` runs: one poison publish per transaction."""

    def __init__(self, index: int, seed: int, first_number: int) -> None:
        self.random = random.Random(seed * 7919 + index)
        self.next_number = first_number
        self.transactions = 0

    def pause(self) -> float:
        return 0.5

    def publish_one(self) -> None:
        from django.db import transaction

        roll = self.random.random()
        n = self.next_number
        self.next_number += 1
        with transaction.atomic():
            if roll < 0.5:
                self._task(n, "note")
            elif roll < 0.6:
                self._task(n, self.random.choice(("nul", "big")))
            elif roll < 0.9:
                self._malformed(n, self.random.choice(sorted(MALFORMED)))
            else:
                self._deep(n)

    def _task(self, n: int, kind: str) -> None:
        from django.db import transaction

        from . import tasks

        fn = {"note": tasks.note, "nul": tasks.nul_result, "big": tasks.big_result}[kind]
        result = fn.enqueue(n)
        transaction.on_commit(lambda: records.write("poison", e="task", n=n, kind=kind,
                                                    rid=result.id))

    def _malformed(self, n: int, why: str) -> None:
        from django.db import transaction

        import django_sqlqueue as sqlqueue

        good = {"id": f"poison-{n}", "task": "tests.chaos.tasks.note", "backend": "default",
                "args": [n], "kwargs": {}, "priority": 0, "run_after": None}
        stored = sqlqueue.publish(TASK_TOPIC, MALFORMED[why](good), key=f"poison-{n % 7}",
                                  id=f"poison-{n}")
        transaction.on_commit(lambda: records.write("poison", e="malformed", n=n, why=why,
                                                    offset=stored.offset))

    def _deep(self, n: int) -> None:
        """A poison message of the chaos topic whose stored payload is too deep to decode,
        as a release without the depth check could have written it. Databases whose JSON
        type refuses that depth cannot hold one: written down as not exercised."""
        from django.db import DatabaseError, transaction

        import django_sqlqueue as sqlqueue
        from django_sqlqueue.limits import MAX_PAYLOAD_DEPTH
        from django_sqlqueue.models import QueueMessage

        from .settings import TOPIC

        key = f"deep{n % 11}"
        stored = sqlqueue.publish(TOPIC, {"n": n, "poison": True}, key=key, id=f"m{n}")
        deep: Any = {"n": n, "poison": True}
        for _ in range(MAX_PAYLOAD_DEPTH + DEEP_EXTRA):
            deep = [deep]
        try:
            with transaction.atomic():
                QueueMessage.objects.filter(offset=stored.offset).update(payload=deep)
        except DatabaseError as exc:
            error = str(exc)[:200]
            transaction.on_commit(lambda: records.write(
                "poison", e="deep_not_stored", n=n, error=error))
        else:
            transaction.on_commit(lambda: records.write("poison", e="deep", n=n,
                                                        offset=stored.offset))
        # Every group must dead-letter it: the group reports know it as a poison message.
        now = time.monotonic()
        transaction.on_commit(lambda: records.write(
            "published", e="committed", tx=f"poison-{n}", ns=[n], keys=[key],
            offsets=[stored.offset], flags={n: "poison"}, c0=now, c1=time.monotonic()))


@dataclass
class PoisonReport:
    tasks: int = 0
    unstorable: int = 0
    malformed: int = 0
    deep: int = 0
    deep_not_stored: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    longest_failing_cycles: float = 0.0

    def line(self) -> str:
        deep = (f"{self.deep} too deep" if not self.deep_not_stored
                else f"{self.deep} too deep ({len(self.deep_not_stored)} the database refused "
                     f"to store, e.g. {self.deep_not_stored[0]})")
        return (f"chaos: poison publisher: {self.tasks} tasks ({self.unstorable} with an "
                f"outcome that cannot be stored as it is), {self.malformed} malformed task "
                f"messages, {deep}; longest run of failing poll cycles of a partition "
                f"{self.longest_failing_cycles:.1f} s (bound {CYCLE_FAILURE_BOUND:g} s)")


def pending() -> int:
    """Messages of the task queue the tasks group has not consumed yet."""
    from django_sqlqueue.models import ConsumerOffset, QueueMessage

    unsequenced = QueueMessage.objects.filter(topic=TASK_TOPIC, position__isnull=True).count()
    counts = ConsumerOffset.objects.unconsumed_counts(TASK_TOPIC, [TASK_GROUP], "default")
    return counts[TASK_GROUP] + unsequenced


def verify(directory: Path, dlq_suffix: str) -> PoisonReport:
    """What became of every poison publish (after the drain)."""
    from django_sqlqueue.models import QueueMessage, TaskResultRecord

    report = PoisonReport()
    written = list(records.read(directory, "poison"))
    task_ids = {r["rid"]: r for r in written if r["e"] == "task"}
    report.tasks = len(task_ids)
    report.unstorable = sum(r["kind"] != "note" for r in task_ids.values())
    results = dict(TaskResultRecord.objects.filter(id__in=list(task_ids))
                   .values_list("id", "status"))
    for rid, r in task_ids.items():
        if results.get(rid) != "SUCCESSFUL":
            report.failures.append(f"task {r['kind']} #{r['n']} ({rid}) ended "
                                   f"{results.get(rid, 'without a result row')}")
    malformed = {r["offset"]: r for r in written if r["e"] == "malformed"}
    report.malformed = len(malformed)
    dead = dict(QueueMessage.objects.filter(topic=TASK_TOPIC + dlq_suffix,
                                            original_offset__in=list(malformed))
                .values_list("original_offset", "last_error"))
    for offset, r in malformed.items():
        reason = dead.get(offset)
        if not reason or not str(reason).strip():
            report.failures.append(f"malformed task message ({r['why']}) at offset {offset}: "
                                   + ("not dead-lettered" if offset not in dead else
                                      "dead-lettered without a reason"))
    report.deep = sum(r["e"] == "deep" for r in written)
    report.deep_not_stored = [r["error"] for r in written if r["e"] == "deep_not_stored"]
    if (left := pending()) != 0:
        report.failures.append(f"{left} message(s) of {TASK_TOPIC} never consumed")
    report.longest_failing_cycles = cycle_failures(directory)
    if report.longest_failing_cycles > CYCLE_FAILURE_BOUND:
        report.failures.append(
            f"a partition's poll cycles kept failing for {report.longest_failing_cycles:.1f} s "
            f"(bound {CYCLE_FAILURE_BOUND:g} s)")
    return report


def cycle_failures(directory: Path) -> float:
    """The longest streak of failing poll cycles of one partition on one worker, in
    seconds: failures of a partition less than STREAK_GAP apart make one streak."""
    longest = 0.0
    for path in sorted(directory.glob("worker-*.log")):
        last: dict[str, tuple[float, float]] = {}  # partition -> (streak start, last failure)
        for line in path.read_text(errors="replace").splitlines():
            match = CYCLE_FAILED.match(line)
            if not match:
                continue
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for partition in match.group(2).split(","):
                start, previous = last.get(partition, (at, at))
                if at - previous > STREAK_GAP:
                    start = at
                last[partition] = (start, at)
                longest = max(longest, at - start)
    return longest
