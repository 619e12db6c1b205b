"""Calling a subscription's hooks (see ``Subscription.hooks``) from the poll cycle."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..consuming.registry import SubscriptionHooks
    from .results import PartitionReport


def call(reports: Iterable[PartitionReport], items: Callable[[PartitionReport], list[Any]],
         each: Callable[[SubscriptionHooks, list[Any]], None]) -> None:
    """Give each subscription that has hooks its ``items`` of this cycle, in one call."""
    batches: dict[tuple[str, str], tuple[SubscriptionHooks, list[Any]]] = {}
    for report in reports:
        hooks = report.partition.subscription.hooks
        if hooks is None:
            continue
        found = items(report)
        if found:
            key = (report.partition.group, report.partition.topic)
            batches.setdefault(key, (hooks, []))[1].extend(found)
    for hooks, found in batches.values():
        each(hooks, found)
