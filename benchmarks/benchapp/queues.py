"""The benchmark handlers.

``bench`` (throughput, idle): a no-op, so the figures measure the queue, not the handler.

``fleet``: a 5 ms handler that appends ``partition offset pid start end`` to a file of its
own process in ``SQLQUEUE_BENCH_FLEET_DIR``, so the benchmark can tell whether two workers
ever handled one partition at the same time.

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


_fleet_fd: int | None = None


@sqlqueue.subscriber("fleet", group="bench")
def record_run(message: sqlqueue.Message) -> None:
    began = time.time()
    time.sleep(0.005)
    ended = time.time()
    global _fleet_fd
    with _lock:
        if _fleet_fd is None:
            folder = os.environ.get("SQLQUEUE_BENCH_FLEET_DIR")
            if not folder:
                return
            _fleet_fd = os.open(os.path.join(folder, f"{os.getpid()}.log"),
                                os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(_fleet_fd, f"{message.partition} {message.offset} {os.getpid()} "
                            f"{began:.6f} {ended:.6f}\n".encode())
