"""Prometheus metrics (the ``metrics`` extra: ``pip install 'django-sqlqueue[metrics]'``).

Two sources, as the Kafka exporter splits them:

* :mod:`.worker`: what one worker process did (counters, histograms, leases held), served
  by ``runqueueworker --metrics-port PORT`` on 127.0.0.1 (``--metrics-address`` to listen
  elsewhere). Off unless that option is given, and then fed by the worker's own signals and
  two timing hooks.
* :mod:`.database`: what the database says about every consumer group (lag, oldest
  pending age, in flight, dead letters, live workers, paused), read at most once per
  ``SQLQUEUE["METRICS_CACHE_SECONDS"]`` by the view in :mod:`django_sqlqueue.views`
  (``include("django_sqlqueue.urls")``), which ``SQLQUEUE["METRICS_TOKEN"]`` guards.

Every name starts with ``sqlqueue_``, uses base units (seconds) and carries only the
``group`` and ``topic`` labels: never a message id, key or offset.
"""

from __future__ import annotations

MISSING = ("prometheus-client is not installed; install it with "
           "pip install 'django-sqlqueue[metrics]'")


def available() -> bool:
    """Whether prometheus-client can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True
