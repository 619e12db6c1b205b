"""The benchmark handlers.

``bench`` (throughput, idle): a no-op, so the figures measure the queue, not the handler.

``latency``: records (offset, time.time() at handler start) by appending one line to the
file named in ``SQLQUEUE_BENCH_LATENCY_LOG``. A local file append, not a database write,
so the measurement adds no load to the database under test.
"""

from __future__ import annotations

import os
import threading
import time

import django_sqlqueue as sqlqueue

_lock = threading.Lock()
_fd: int | None = None


@sqlqueue.subscriber("bench", group="bench")
def noop(message: sqlqueue.Message) -> None:
    return None


@sqlqueue.subscriber("latency", group="bench")
def record_latency(message: sqlqueue.Message) -> None:
    received = time.time()
    global _fd
    with _lock:
        if _fd is None:
            path = os.environ.get("SQLQUEUE_BENCH_LATENCY_LOG")
            if not path:
                return
            _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(_fd, f"{message.offset} {received:.6f} {message.attempt}\n".encode())
