"""Partition leases and fair share: who consumes which partition of a consumer group.

Every renew interval a worker heartbeats, renews all its leases in one statement, counts
the group's live workers, and moves towards its fair share ``ceil(partitions / workers)``:
it takes free or stale partitions when below it (and, on PostgreSQL and MariaDB/MySQL,
those of a worker whose process is gone: see :mod:`.liveness`, which also keeps such a
worker out of the count), and when above it drains the excess
(stops fetching, lets in-flight handlers finish) and then releases it. Excess is chosen
deterministically (the highest partition numbers), so repeated rebalances do not shuffle
partitions. A topic has a fixed number of partitions, so a group has exactly that many
lease rows per topic, however many keys its messages carry.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable

from django.db import connections, transaction

from ..cancelling import skip_cancelled
from ..consuming.registry import Subscription
from ..db import liveness as liveness_locks
from ..db.errors import is_transient
from ..logtext import loggable, number_ranges
from ..models import ConsumerOffset, PartitionLease, SubscriberHeartbeat, Topic
from ..partitioning import partition_names
from ..sequencing import partition_counts, record_configured_topics
from .liveness import LivenessLock
from .partitions import Ident, Partition

logger = logging.getLogger("django_sqlqueue.worker")


class Leasing:
    def __init__(self, worker_name: str, using: str, subscriptions: list[Subscription],
                 lease_duration: float, liveness: bool = False) -> None:
        self.worker_name = worker_name
        # Unique to this process: a worker paused past its lease and its replacement under
        # the same name are two owners to the lease table, never one.
        self.token = uuid.uuid4().hex
        # The lock that tells other workers at once when this process is gone, and lets it
        # tell when theirs are (see .liveness); None: leases alone.
        self.liveness = LivenessLock(self.token, using) if liveness else None
        self._liveness_seen = (-1, False)  # (the lock's changes, seen held) when last asked
        self._liveness_advertised = 0  # the lock's changes when maintain last wrote it
        self.using = using
        self.subscriptions = subscriptions
        self.lease_seconds = lease_duration
        self.lease_ms = int(lease_duration * 1000)
        self.partitions: dict[Ident, Partition] = {}
        self.counts: dict[str, int] = {}  # recorded partitions per subscribed topic
        # Per subscription: the fair share from the last rebalance (None = unlimited).
        self.shares: dict[tuple[str, str], int | None] = {}
        self.nothing_claimable = False
        # Per subscription: (partitions, live workers) from the last rebalance, for logs.
        self.last_counts: dict[tuple[str, str], tuple[int, int]] = {}
        # Partitions given up on (see give_up), and until when (time.monotonic()).
        self._shunned: dict[Ident, float] = {}

    # ----------------------------------------------------------------- lifecycle

    def name_in_use(self, now_ms: int) -> bool:
        """Whether a live worker already runs under this worker's name (one killed, whose
        liveness lock is gone, does not: its replacement need not wait for its lease)."""
        return SubscriberHeartbeat.objects.name_in_use(
            self.worker_name, now_ms - self.lease_ms, self.using,
            judge_liveness=self._judging())

    def prepare(self) -> None:
        """Record each subscribed topic's partition count, and each topic's named in
        ``SQLQUEUE["TOPICS"]`` (the configured one, unless the topic already has one), and
        create the group's lease rows (at start-up)."""
        record_configured_topics(self.using)
        self._ensure_partitions(partition_counts(sorted({s.topic for s in self.subscriptions}),
                                                 self.using))

    def _ensure_partitions(self, counts: dict[str, int]) -> None:
        changed = {topic: n for topic, n in counts.items() if self.counts.get(topic) != n}
        for topic, count in changed.items():
            if count < self.counts.get(topic, count):
                # The topic shrank. Repartitioning deleted the removed partitions' rows, but
                # a worker that read the old count just before may have inserted lease rows
                # for them again (this one, at start-up): remove them, so nobody leases a
                # partition that no longer exists.
                keep = set(partition_names(count))
                PartitionLease.objects.delete_other_partitions(topic, keep, self.using)
                ConsumerOffset.objects.delete_other_partitions(topic, keep, self.using)
        for subscription in self.subscriptions:
            if subscription.topic in changed:
                names = partition_names(changed[subscription.topic])
                PartitionLease.objects.ensure_partitions(
                    subscription.group, subscription.topic, names, self.using)
                # Registers the group before anything is fetched: from now on GC keeps
                # every message of the topic until the group has acked it.
                ConsumerOffset.objects.ensure(subscription.group, subscription.topic, names,
                                              self.using)
                skip_cancelled(subscription.group, subscription.topic, names, self.using)
        self.counts.update(changed)

    def maintain(self, now_ms: int, acquire: bool = True) -> None:
        """Heartbeat, renew, rebalance and acquire: the renew-interval work."""
        if self.liveness is not None:
            self._liveness_advertised = self.liveness.changes
        liveness_token = self._liveness_token()
        SubscriberHeartbeat.objects.beat_many(
            [(s.group, s.topic) for s in self.subscriptions], self.worker_name, now_ms,
            self.using, liveness_token,
        )
        # Leases confirmed below are surely ours until this moment plus a lease: taken
        # before the renewal was sent, so a slow round trip only shortens it.
        renewing_at = time.monotonic()
        renewed = PartitionLease.objects.renew(self.worker_name, self.token, now_ms, self.using,
                                               liveness_token)
        # A topic repartitioned by an operator gets lease rows for its new partitions.
        self._ensure_partitions(Topic.objects.partition_counts(list(self.counts), self.using))
        live = self._live_workers(now_ms)
        owned = PartitionLease.objects.owned_by(self.worker_name, self.token, self.using)
        for subscription in self.subscriptions:
            self._reconcile(subscription, renewing_at + self.lease_seconds, renewed,
                            owned.get((subscription.group, subscription.topic), {}))
            self.shares[(subscription.group, subscription.topic)] = self._fair_share(
                subscription, live
            )
            self._mark_excess(subscription)
        if acquire:
            self.acquire(now_ms)

    def membership_changed(self, now_ms: int) -> bool:
        """Whether workers joined or left any group since the last rebalance (one query)."""
        live = self._count_live_workers(now_ms)
        return any(
            live.get((s.group, s.topic), 0) != self.last_counts.get((s.group, s.topic), (0, 0))[1]
            for s in self.subscriptions
        )

    def liveness_changed(self) -> bool:
        """Whether this worker's liveness lock was taken or lost since its lease rows and
        heartbeats last said so (the next maintain should, without waiting a renewal)."""
        return self.liveness is not None and self.liveness.changes != self._liveness_advertised

    def below_share(self) -> bool:
        for subscription in self.subscriptions:
            share = self.shares.get((subscription.group, subscription.topic))
            if share is None or self._held(subscription) < share:
                return True
        return False

    def acquire(self, now_ms: int) -> list[Partition]:
        """Take free or stale partitions up to each subscription's fair share."""
        taken: list[Partition] = []
        claimable_left = False
        for subscription in self.subscriptions:
            share = self.shares.get((subscription.group, subscription.topic))
            want = 1_000_000 if share is None else share - self._held(subscription)
            if want <= 0:
                continue
            new = self._take(subscription, want, now_ms)
            taken += new
            # Once at its share a worker claims no more: the rest is the other workers'.
            # Only without a share (no live count) may more be left to claim.
            claimable_left = claimable_left or (share is None and len(new) == want)
        self.nothing_claimable = not claimable_left
        return taken

    def release_drained(self, awaited: Callable[[Ident, int], bool],
                        pending: Callable[[], set[Ident]]) -> None:
        """Release draining partitions that wait for no handler and no outcome.

        ``awaited(partition, offset)`` says whether an in-flight message's handler still
        runs here and is not given up on (past MAX_HANDLER_TIME): a hung handler must not
        keep a partition being handed to another worker from everybody, and an in-flight
        message with no handler here at all (one skipped because the lease was in doubt,
        or whose outcome could not be recorded) waits for nothing. The new owner
        redelivers such messages once their visibility runs out. ``pending()`` is asked
        after the handlers, so an outcome reported in between is never passed over.
        """
        drained = [
            p for p in self.partitions.values()
            if p.draining and not any(awaited(p.ident, entry.offset) for entry in p.in_flight())
        ]
        if drained:
            waiting = pending()
            self._release([p for p in drained if p.ident not in waiting])

    def give_up(self, partition: Partition) -> None:
        """Release a partition this worker cannot make progress on, and leave it to the
        other workers of its group for a lease before taking it again."""
        self._release([partition])
        self._shunned[partition.ident] = time.monotonic() + self.lease_seconds

    def release_all(self) -> None:
        self._release(list(self.partitions.values()))

    def deregister(self, now_ms: int) -> None:
        SubscriberHeartbeat.objects.deregister(self.worker_name, now_ms, self.using)

    def drop(self, partitions: Iterable[Partition]) -> None:
        """Forget partitions another worker took over."""
        for partition in partitions:
            partition.lost = True
            if self.partitions.get(partition.ident) is partition:
                del self.partitions[partition.ident]
                # One line per lease: losing one is rare, and each says which generation.
                logger.warning(
                    "lease lost group=%s topic=%s partition=%s generation=%s",
                    partition.group, partition.topic, partition.number, partition.generation,
                )

    # ----------------------------------------------------------------- internals

    def _held(self, subscription: Subscription) -> int:
        return sum(
            1 for p in self.partitions.values()
            if p.subscription is subscription and not p.draining
        )

    def _count_live_workers(self, now_ms: int) -> dict[tuple[str, str], int]:
        """Live workers per (group, topic) of this worker's subscriptions, in one query.
        A worker whose liveness lock is gone is not one, however fresh its heartbeat: the
        others then share its partitions at once."""
        return SubscriberHeartbeat.objects.active_counts(
            sorted({s.topic for s in self.subscriptions}), now_ms - self.lease_ms, self.using,
            judge_liveness=self._judging(),
        )

    def _liveness_token(self) -> str:
        """This process's token while it holds its liveness lock and its own connection
        sees it held (as the other workers will), else '': what its lease rows and
        heartbeats say. Seen from here once per change of the lock (one query)."""
        lock = self.liveness
        if lock is None or not lock.held():
            return ""
        changes = lock.changes
        if self._liveness_seen[0] != changes:
            seen = liveness_locks.seen_held(connections[self.using], self.token)
            if not seen:
                logger.warning("liveness lock not seen from the worker's own connection (is "
                               "the liveness connection on another server?); judged by its "
                               "lease alone")
            self._liveness_seen = (changes, seen)
        return self.token if self._liveness_seen[1] else ""

    def judges_liveness(self) -> bool:
        """Whether this worker judges others by their liveness locks now (see _judging)."""
        return self._judging()

    def _judging(self) -> bool:
        """Whether to judge other workers by their liveness locks: only while this worker's
        own has been held, and seen, for a while (see .liveness)."""
        return (self.liveness is not None and self.liveness.settled()
                and self._liveness_token() != "")

    def _live_workers(self, now_ms: int) -> dict[tuple[str, str], int] | None:
        try:
            return self._count_live_workers(now_ms)
        except Exception as exc:  # noqa: BLE001 - availability over fairness, as the RFC says
            if is_transient(exc):
                # A lost connection or a deadlock: the cycle's next statement meets it too
                # and is retried as usual; a traceback would only add noise to a failover.
                logger.warning("fair share unavailable, acquiring without a cap error=%s: %s",
                               type(exc).__name__, loggable(exc, 300))
            else:
                logger.warning("fair share unavailable, acquiring without a cap", exc_info=True)
            return None

    def _fair_share(self, subscription: Subscription,
                    live: dict[tuple[str, str], int] | None) -> int | None:
        """``ceil(partitions / live workers)``; None (no cap) if it cannot be computed."""
        if live is None:
            return None
        group, topic = subscription.group, subscription.topic
        total = self.counts.get(topic, 0)
        active = live.get((group, topic), 0)
        self.last_counts[(group, topic)] = (total, active)
        if total == 0:
            return 0
        return math.ceil(total / max(active, 1))

    def _reconcile(self, subscription: Subscription, valid_until: float,
                   renewed: set[Ident], owned: dict[str, int]) -> None:
        """Make local state match the lease table: drop partitions taken from us, and adopt
        leases this process holds that it does not know (say, a take whose follow-up read
        failed), so that no lease is renewed forever without being consumed. An adopted
        lease starts a new generation. Only the ``renewed`` leases are surely ours until
        ``valid_until``. ``owned`` is what the lease table says this process holds of the
        subscription's topic."""
        group, topic = subscription.group, subscription.topic
        for partition in list(self.partitions.values()):
            if partition.subscription is subscription:
                if owned.get(partition.number) != partition.generation:
                    self.drop([partition])
                elif partition.ident in renewed:
                    partition.valid_until = valid_until
        unknown = [n for n in owned if (group, topic, n) not in self.partitions]
        if not unknown:
            return
        PartitionLease.objects.adopt(group, topic, unknown, self.worker_name, self.token,
                                     self.using, self._liveness_token())
        owned = PartitionLease.objects.owned(group, topic, self.worker_name, self.token,
                                             self.using)
        for number in unknown:
            if number in owned:
                partition = Partition(subscription, number, owned[number],
                                      valid_until=valid_until if (group, topic, number) in renewed
                                      else 0.0)
                self.partitions[partition.ident] = partition
                logger.warning("lease adopted group=%s topic=%s partition=%s generation=%s",
                               group, topic, number, partition.generation)

    def _mark_excess(self, subscription: Subscription) -> None:
        share = self.shares.get((subscription.group, subscription.topic))
        if share is None:
            return
        held = sorted(
            (p for p in self.partitions.values()
             if p.subscription is subscription and not p.draining),
            key=lambda p: int(p.number),
        )
        partitions, workers = self.last_counts.get((subscription.group, subscription.topic), (0, 0))
        excess = held[share:]
        for partition in excess:
            partition.draining = True
        if excess:
            logger.info(
                "rebalancing: releasing group=%s topic=%s partitions=%s share=%s of=%s "
                "workers=%s", subscription.group, subscription.topic,
                number_ranges(p.number for p in excess), share, partitions, workers,
            )

    def _take(self, subscription: Subscription, want: int, now_ms: int) -> list[Partition]:
        group, topic = subscription.group, subscription.topic
        stale_before = now_ms - self.lease_ms
        taking_at = time.monotonic()
        judging = self._judging()
        with transaction.atomic(using=self.using):
            numbers = PartitionLease.objects.claimable(group, topic, stale_before, want,
                                                       self.using, judging)
            # Never re-take a partition this worker is still draining, nor one the topic
            # no longer has (see _ensure_partitions).
            count = self.counts.get(topic, 0)
            now = time.monotonic()
            self._shunned = {k: until for k, until in self._shunned.items() if until > now}
            numbers = [n for n in numbers
                       if (group, topic, n) not in self.partitions and int(n) < count
                       and (group, topic, n) not in self._shunned]
            if not numbers:
                return []
            PartitionLease.objects.take(group, topic, numbers, self.worker_name, self.token,
                                        stale_before, now_ms, self.using,
                                        judge_liveness=judging,
                                        liveness_token=self._liveness_token())
        owned = PartitionLease.objects.owned(group, topic, self.worker_name, self.token,
                                             self.using)
        taken = []
        for number in numbers:
            if number not in owned:
                continue
            # Its watermark row and window are set up by the next poll cycle.
            partition = Partition(subscription, number, owned[number],
                                  valid_until=taking_at + self.lease_seconds)
            self.partitions[partition.ident] = partition
            taken.append(partition)
        _log_per_subscription(logging.INFO, "leases acquired", taken)
        return taken

    def _release(self, partitions: list[Partition]) -> None:
        by_subscription: dict[tuple[str, str], dict[str, int]] = {}
        for partition in partitions:
            by_subscription.setdefault((partition.group, partition.topic), {})[partition.number] = (
                partition.generation
            )
        for (group, topic), held in by_subscription.items():
            PartitionLease.objects.release(group, topic, held, self.worker_name, self.token,
                                           self.using)
        for partition in partitions:
            partition.lost = True
            self.partitions.pop(partition.ident, None)
        _log_per_subscription(logging.INFO, "leases released", partitions)


def _log_per_subscription(level: int, what: str, partitions: list[Partition]) -> None:
    """One line per (group, topic) naming its partitions as numeric runs (``0-3,7``),
    not one line per lease: a worker starting on 80 partitions logs a few lines."""
    by_subscription: dict[tuple[str, str], list[str]] = {}
    for partition in partitions:
        by_subscription.setdefault((partition.group, partition.topic), []).append(
            partition.number)
    for (group, topic), numbers in sorted(by_subscription.items()):
        logger.log(level, "%s group=%s topic=%s partitions=%s count=%s", what, group, topic,
                   number_ranges(numbers), len(numbers))
