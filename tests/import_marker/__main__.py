"""Run as a program when imported (as ``venv.__main__`` is): writes the marker file too."""

from __future__ import annotations

import os
from pathlib import Path

if marker := os.environ.get("SQLQUEUE_TEST_IMPORT_MARKER"):
    with Path(marker).open("a") as f:
        f.write(f"{__name__} imported in process {os.getpid()}\n")


def run() -> None:
    """Never reached: a task path naming this module is refused before any import."""
