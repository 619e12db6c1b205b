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

from django.http import HttpRequest, QueryDict
from django.utils.http import urlencode

from ..conf import queue_aliases, read_database

# Seconds after an action during which the operator's pages read the queue's database: far
# beyond a healthy replica's delay (milliseconds to a few seconds), short enough that the
# replica takes the load again soon after.
PRIMARY_AFTER_ACTION = 60.0
SESSION_KEY = "sqlqueue_primary_until"  # time.time() until which this session reads the primary
SAFE_METHODS = ("GET", "HEAD")
# The query-string (or form) parameter naming the queue alias a page shows, where
# SQLQUEUE["TOPICS"] places topics on several; the queue's own alias without it.
DATABASE_PARAMETER = "database"


def queue_alias_for(request: HttpRequest | None) -> str:
    """The queue alias ``request`` asks about: its ``database`` parameter (also inside the
    ``_changelist_filters`` a detail page carries back to its list) when it names a queue
    alias, else the queue's own."""
    aliases = queue_aliases()
    if request is None or len(aliases) == 1:
        return aliases[0]
    wanted = request.GET.get(DATABASE_PARAMETER)
    if request.method == "POST":
        wanted = request.POST.get(DATABASE_PARAMETER) or wanted
    if not wanted and request.GET.get("_changelist_filters"):
        wanted = QueryDict(request.GET["_changelist_filters"]).get(DATABASE_PARAMETER)
    return wanted if wanted in aliases else aliases[0]


def database_choices(request: HttpRequest) -> list[dict[str, object]]:
    """The switch between queue aliases a page shows: each alias, its URL, whether it is
    the one shown. Empty with one alias."""
    aliases = queue_aliases()
    if len(aliases) == 1:
        return []
    shown = queue_alias_for(request)
    return [{"alias": alias, "url": f"{request.path}?{DATABASE_PARAMETER}={alias}",
             "current": alias == shown} for alias in aliases]


def database_for(request: HttpRequest | None) -> str:
    """The alias this request reads the queue from: the read replica for a page, the
    queue's database for an action (which also pins the session to it for a while)."""
    alias = queue_alias_for(request)
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


def database_query(request: HttpRequest | None) -> str:
    """``database=<alias>`` for the links and forms of a page showing another queue alias
    than the queue's own (they must show the same one), else ""."""
    alias = queue_alias_for(request)
    return "" if alias == queue_aliases()[0] else urlencode({DATABASE_PARAMETER: alias})
