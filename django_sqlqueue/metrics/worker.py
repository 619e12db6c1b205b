"""A worker's own metrics, served over HTTP by ``runqueueworker --metrics-port``.

The counters are fed by the worker's signals (sent once per delivery or outcome, after
the change committed), the histograms by two hooks the worker calls only when metrics are
on: nothing here runs otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .. import signals

if TYPE_CHECKING:
    from ..worker.partitions import Ident, Partition

# Handler times span milliseconds to minutes; polls are usually well under a second.
HANDLER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0)
POLL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

_SIGNALS = {
    "delivered": signals.message_delivered,
    "acked": signals.message_acked,
    "nacked": signals.message_nacked,
    "dead_lettered": signals.message_dead_lettered,
}


class WorkerMetrics:
    """The counters, histograms and the leases gauge of one worker process, in a registry
    of their own (so tests and embedded workers never collide in the global one)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("group", "topic")
        self.counters = {
            name: Counter(f"sqlqueue_messages_{name}", f"Messages {name.replace('_', '-')} "
                          "by this worker.", labels, registry=self.registry)
            for name in _SIGNALS
        }
        self.handler_seconds = Histogram(
            "sqlqueue_handler_duration_seconds", "Time a handler ran, whatever its outcome.",
            labels, buckets=HANDLER_BUCKETS, registry=self.registry)
        self.poll_seconds = Histogram(
            "sqlqueue_poll_duration_seconds", "Time one poll of the worker's loop took.",
            buckets=POLL_BUCKETS, registry=self.registry)
        self._receivers: list[tuple[Any, Callable[..., None]]] = []
        self._server: Any = None

    def watch_leases(self, partitions: Callable[[], Iterable[Partition]]) -> None:
        """Serve ``sqlqueue_leases_held`` from the worker's partitions at scrape time."""
        self.registry.register(_LeasesCollector(partitions))

    def connect(self) -> None:
        """Count the worker's signals (weakly referenced receivers: kept on self)."""
        for name, signal in _SIGNALS.items():
            counter = self.counters[name]

            def receive(*, subscription: Any, counter: Any = counter, **kwargs: Any) -> None:
                counter.labels(subscription.group, subscription.topic).inc()

            signal.connect(receive, dispatch_uid=f"sqlqueue-metrics-{name}-{id(self)}")
            self._receivers.append((signal, receive))

    def disconnect(self) -> None:
        for name, signal in _SIGNALS.items():
            signal.disconnect(dispatch_uid=f"sqlqueue-metrics-{name}-{id(self)}")
        self._receivers.clear()

    def handler_finished(self, ident: Ident, seconds: float) -> None:
        self.handler_seconds.labels(ident[0], ident[1]).observe(seconds)

    def poll_finished(self, seconds: float) -> None:
        self.poll_seconds.observe(seconds)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` (any path, in fact) on ``addr`` and ``port`` from a daemon
        thread."""
        from prometheus_client import start_http_server

        self._server = start_http_server(port, addr=addr, registry=self.registry)

    def stop(self) -> None:
        self.disconnect()
        if self._server is not None:
            server = self._server[0] if isinstance(self._server, tuple) else self._server
            server.shutdown()
            self._server = None


class _LeasesCollector:
    def __init__(self, partitions: Callable[[], Iterable[Partition]]) -> None:
        self.partitions = partitions

    def describe(self) -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        return [GaugeMetricFamily("sqlqueue_leases_held", "Partitions this worker holds.",
                                  labels=["group", "topic"])]

    def collect(self) -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("sqlqueue_leases_held", "Partitions this worker holds.",
                                   labels=["group", "topic"])
        counts: dict[tuple[str, str], int] = {}
        for partition in self.partitions():
            key = (partition.group, partition.topic)
            counts[key] = counts.get(key, 0) + 1
        for (group, topic), count in sorted(counts.items()):
            family.add_metric([group, topic], count)
        return [family]
