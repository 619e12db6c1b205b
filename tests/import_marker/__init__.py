"""A module no task path may import: importing it writes the file named by
``SQLQUEUE_TEST_IMPORT_MARKER`` (tests/test_task_paths.py checks that it never appears)."""

from __future__ import annotations

import os
from pathlib import Path

if marker := os.environ.get("SQLQUEUE_TEST_IMPORT_MARKER"):
    with Path(marker).open("a") as f:
        f.write(f"{__name__} imported in process {os.getpid()}\n")


def not_a_task() -> None:
    """A function, not a @task: a message naming it must not be run, nor its module imported."""
