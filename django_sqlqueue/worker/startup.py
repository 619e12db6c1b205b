"""Starting a worker: a name no live worker uses, the log head noted, and the topics'
partitions recorded with their lease rows.

Two live workers under one name would share leases. A worker restarted after a crash
finds its previous self's heartbeat still fresh: it waits for that lease to go stale,
and refuses to start if the name is still in use after it. Where workers hold liveness
locks, it waits only until its own lock has settled and it sees its previous self's gone
(a few seconds).
"""

from __future__ import annotations

import logging
import time

from ..db.schema_state import migrate_line
from ..models import LogSequencer
from .clock import DatabaseClock
from .leasing import Leasing
from .session import SessionBounds

logger = logging.getLogger("django_sqlqueue.worker")

NAME_RETRY = 0.5  # seconds between looks at whether a previous worker's name came free
MIGRATE_RETRY = 2.0  # seconds between looks at whether the migrations were applied
MIGRATE_LOG_EVERY = 60.0  # seconds between two "not migrated" lines of a waiting worker
NOT_MIGRATED_STATUS = 1  # exit status of a burst worker on a database not migrated


class Startup:
    def __init__(self, name: str, using: str, leasing: Leasing, session: SessionBounds,
                 clock: DatabaseClock, name_wait: float, wait_for_migrate: bool = True) -> None:
        self.name = name
        self.using = using
        self.leasing = leasing
        self.session = session
        self.clock = clock
        self.name_wait = name_wait  # seconds a previous worker's lease may take to expire
        self.head: int | None = None  # the log head it started at; None until started
        self.refusal = ""  # why it refused to start; '' unless it did
        self.refusal_status = 2  # the exit status that goes with it
        # Wait (saying so once a minute) for `manage.py migrate`, or refuse at once.
        self.wait_for_migrate = wait_for_migrate
        self.migrated = False
        self._name_deadline: float | None = None
        self._next_migrate_line = 0.0

    def attempt(self) -> float:
        """Check the name is free, note the log head, record the topics' partition counts
        and create their lease rows. Returns 0 once started (or refused), else seconds
        until the next try."""
        if not self.migrated:
            line = migrate_line(self.using)
            if line is not None:
                return self.not_migrated(line)
            self.migrated = True
        self.session.ensure()
        head, _, db_now = LogSequencer.objects.head(self.using)
        self.clock.sync(db_now)
        if self.leasing.name_in_use(db_now):
            return self._name_taken()
        self.leasing.prepare()
        self.head = head
        return 0.0

    def not_migrated(self, line: str) -> float:
        """The queue tables are missing or behind: refuse (burst), or say so once a minute
        and look again in MIGRATE_RETRY seconds."""
        if not self.wait_for_migrate:
            self.refusal, self.refusal_status = line, NOT_MIGRATED_STATUS
            return 0.0
        now = time.monotonic()
        if now >= self._next_migrate_line:
            self._next_migrate_line = now + MIGRATE_LOG_EVERY
            logger.warning("%s; waiting for it (checking every %.0fs)", line, MIGRATE_RETRY)
        self.migrated = False
        return MIGRATE_RETRY

    def _name_taken(self) -> float:
        """Wait for a previous worker of this name (restarted after a crash) to go stale,
        or refuse to start."""
        now = time.monotonic()
        if self._name_deadline is None:
            self._name_deadline = now + self.name_wait
            logger.warning("a worker named %s was alive moments ago; waiting up to %.0fs for its "
                           "lease to expire", self.name, self._name_deadline - now)
        if now < self._name_deadline:
            return NAME_RETRY
        self.refusal = (f"another worker named {self.name!r} is running; give each worker a "
                        "unique --name")
        logger.error("%s", self.refusal)
        return 0.0
