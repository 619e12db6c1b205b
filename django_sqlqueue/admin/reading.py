"""Which database an admin page reads: the read replica for what only looks, the queue's
own database for what acts, and for the pages an operator sees just after acting.

A page shown by GET reads ``SQLQUEUE["READ_DATABASE"]`` (see :func:`read_database`): its
figures may lag the queue by the replica's delay. A POST (an action, its confirmation
page, deliver now, release, forget, pause) reads and writes the queue's database, so an
action runs on exactly the rows it names, as they are now. It also sends the session's
pages to the queue's database for ``PRIMARY_AFTER_ACTION`` seconds: the page an action
redirects to, and the next few the operator opens, show the action's result rather than a
replica that has not replayed it yet.
"""

from __future__ import annotations

import time

from django.http import HttpRequest

from ..conf import queue_database, read_database

# Seconds after an action during which the operator's pages read the queue's database: far
# beyond a healthy replica's delay (milliseconds to a few seconds), short enough that the
# replica takes the load again soon after.
PRIMARY_AFTER_ACTION = 60.0
SESSION_KEY = "sqlqueue_primary_until"  # time.time() until which this session reads the primary
SAFE_METHODS = ("GET", "HEAD")


def database_for(request: HttpRequest | None) -> str:
    """The alias this request reads the queue from: the read replica for a page, the
    queue's database for an action (which also pins the session to it for a while)."""
    alias = queue_database()
    if request is None:
        return alias
    session = getattr(request, "session", None)
    if request.method not in SAFE_METHODS:
        if session is not None:
            session[SESSION_KEY] = time.time() + PRIMARY_AFTER_ACTION
        return alias
    if session is not None and float(session.get(SESSION_KEY) or 0) > time.time():
        return alias
    return read_database(alias)
