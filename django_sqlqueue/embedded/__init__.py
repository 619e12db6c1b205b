"""A queue worker inside the web process, for deployments without a worker fleet.

``sqlqueue_asgi`` wraps an ASGI application (the worker follows the lifespan events),
``sqlqueue_wsgi`` a WSGI one (started on the first request, stopped at exit), and
:mod:`django_sqlqueue.embedded.gunicorn` holds gunicorn's ``post_fork`` and
``worker_exit`` hooks. Each runs runqueueworker's engines in a thread of its own, with
options from keyword arguments over ``SQLQUEUE["EMBEDDED"]``. See docs/operating.md,
"A worker inside the web process".
"""

from __future__ import annotations

from .asgi import sqlqueue_asgi
from .runner import EmbeddedWorker
from .wsgi import sqlqueue_wsgi

__all__ = ["EmbeddedWorker", "sqlqueue_asgi", "sqlqueue_wsgi"]
