"""What the chaos processes write down, as JSON lines, and reading it back.

Every process appends to its own file in the run directory (``CHAOS_DIR``), one
``os.write`` per line on an ``O_APPEND`` descriptor: a line written before a ``kill -9``
is in the kernel's page cache and survives the process. Times are ``time.monotonic()``,
which is one clock for every process of the machine (the skewed worker fakes only its
wall clock).

Lines, by ``e`` (event):
- handlers: ``start`` and ``end`` of each handler run (``ok`` false when it raised);
- publishers: ``committed`` and ``rolled_back`` message numbers, ``duplicate`` re-publishes;
- the orchestrator: each injected fault (``kill``, ``stop``, ``cont``, ``db_down``, ...).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_fds: dict[str, int] = {}


def run_directory() -> Path:
    return Path(os.environ["CHAOS_DIR"])


def write(stream: str, **fields: Any) -> None:
    """Append one record to this process's ``<stream>-<pid>.jsonl`` file."""
    fields.setdefault("t", time.monotonic())
    fields.setdefault("p", os.getpid())
    line = (json.dumps(fields, separators=(",", ":")) + "\n").encode()
    path = str(run_directory() / f"{stream}-{os.getpid()}.jsonl")
    with _lock:
        fd = _fds.get(path)
        if fd is None:
            fd = _fds[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, line)


def read(directory: Path, stream: str) -> Iterator[dict[str, Any]]:
    """Every record of ``stream`` from every process, file by file. A line cut short by a
    kill (the last one of a file) is skipped."""
    for path in sorted(directory.glob(f"{stream}-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
