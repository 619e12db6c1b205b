"""The benchmark handlers.

``bench`` (throughput, idle): a no-op, so the figures measure the queue, not the handler.

``fleet``: a 5 ms handler that appends ``partition offset pid start end`` to a file of its
own process in ``SQLQUEUE_BENCH_FLEET_DIR``, so the benchmark can tell whether two workers
ever handled one partition at the same time.

``waiting`` and ``waiting_strict`` (the waiting benchmark): append each handled message's
key to the file named in ``SQLQUEUE_BENCH_WAITING_LOG``; in ``waiting_strict`` (strict mode)
a message with ``{"fail": true}`` fails on every attempt.

``recovery``: appends ``partition offset pid start attempt published`` to a file of its
own process in ``SQLQUEUE_BENCH_RECOVERY_DIR`` (a killed worker's file keeps what it wrote
before the kill), ``published`` being the payload's ``t``.

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
_files: dict[str, int] = {}  # path -> file descriptor, opened on first use


def append_line(path: str | None, line: str) -> None:
    """Append ``line`` to ``path`` (nothing when the benchmark did not ask for it)."""
    if not path:
        return
    with _lock:
        fd = _files.get(path)
        if fd is None:
            fd = _files[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{line}\n".encode())


@sqlqueue.subscriber("bench", group="bench")
@sqlqueue.subscriber("bench_b", group="bench")  # scaleout: the topic a second server may hold
def noop(message: sqlqueue.Message) -> None:
    return None


@sqlqueue.subscriber("latency", group="bench")
def record_latency(message: sqlqueue.Message) -> None:
    received = time.time()
    append_line(os.environ.get("SQLQUEUE_BENCH_LATENCY_LOG"),
                f"{message.offset} {received:.6f} {message.attempt}")


@sqlqueue.subscriber("fleet", group="bench")
def record_run(message: sqlqueue.Message) -> None:
    began = time.time()
    time.sleep(0.005)
    ended = time.time()
    folder = os.environ.get("SQLQUEUE_BENCH_FLEET_DIR")
    append_line(folder and os.path.join(folder, f"{os.getpid()}.log"),
                f"{message.partition} {message.offset} {os.getpid()} {began:.6f} {ended:.6f}")


@sqlqueue.subscriber("waiting", group="bench")
def record_key(message: sqlqueue.Message) -> None:
    append_line(os.environ.get("SQLQUEUE_BENCH_WAITING_LOG"), message.key)


@sqlqueue.subscriber("waiting_strict", group="bench", batch_size=1, max_attempts=1_000_000,
                     backoff=sqlqueue.ExponentialBackoff(base=1.0, cap=2.0))
def record_key_or_fail(message: sqlqueue.Message) -> None:
    if isinstance(message.payload, dict) and message.payload.get("fail"):
        raise RuntimeError("this key fails on every attempt")
    append_line(os.environ.get("SQLQUEUE_BENCH_WAITING_LOG"), message.key)


# ``limited`` (max_running=3, 50 ms), ``rated`` (rate="200/s") and ``unlimited`` (5 ms, no
# limit) for the limits benchmark: each run appends "start end" to the file of its own
# topic in SQLQUEUE_BENCH_LIMITS_DIR (``limited`` also its partition).


def _log_limited_run(topic: str, sleep: float, partition: str = "") -> None:
    began = time.time()
    if sleep:
        time.sleep(sleep)
    folder = os.environ.get("SQLQUEUE_BENCH_LIMITS_DIR")
    append_line(folder and os.path.join(folder, f"{topic}.log"),
                f"{began:.6f} {time.time():.6f} {partition}".rstrip())


@sqlqueue.subscriber("limited", group="bench", max_running=3)
def limited(message: sqlqueue.Message) -> None:
    _log_limited_run("limited", 0.05, message.partition)


@sqlqueue.subscriber("rated", group="bench", rate="200/s")
def rated(message: sqlqueue.Message) -> None:
    _log_limited_run("rated", 0)


@sqlqueue.subscriber("unlimited", group="bench")
def unlimited(message: sqlqueue.Message) -> None:
    _log_limited_run("unlimited", 0.005)


@sqlqueue.subscriber("latency_workers", group="bench")
def record_latency_with_worker(message: sqlqueue.Message) -> None:
    received = time.time()
    append_line(os.environ.get("SQLQUEUE_BENCH_LATENCY_LOG"),
                f"{message.offset} {received:.6f} {os.getpid()}")


@sqlqueue.subscriber("recovery", group="bench")
def record_recovery_run(message: sqlqueue.Message) -> None:
    began = time.time()
    folder = os.environ.get("SQLQUEUE_BENCH_RECOVERY_DIR")
    published = message.payload.get("t", 0.0) if isinstance(message.payload, dict) else 0.0
    append_line(folder and os.path.join(folder, f"{os.getpid()}.log"),
                f"{message.partition} {message.offset} {os.getpid()} {began:.6f} "
                f"{message.attempt} {published:.6f}")
