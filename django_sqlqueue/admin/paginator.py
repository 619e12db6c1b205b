"""A paginator that never counts a whole table.

Django's changelist counts every matching row (``SELECT COUNT(*)``) to number its pages.
On a log of millions of rows that count alone takes longer than the page should, so this
paginator counts at most ``CAP`` rows: beyond that the page says "more than".
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.core.paginator import Paginator

COUNT_CAP = 10_000  # rows counted at most; reading them is a short index range


class CappedPaginator(Paginator):
    """``count`` is the true number up to COUNT_CAP, and COUNT_CAP + 1 above it."""

    cap = COUNT_CAP

    @cached_property
    def count(self) -> int:
        # COUNT over a LIMITed subquery: the database stops reading after cap + 1 rows.
        query: Any = self.object_list
        return int(query.order_by()[: self.cap + 1].count())

    @property
    def capped(self) -> bool:
        """Whether there are more rows than were counted."""
        return self.count > self.cap
