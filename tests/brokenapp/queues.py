"""A queues.py with a broken import, as after renaming a module it still uses."""

from __future__ import annotations

from tests.brokenapp.renamed_handlers import handle_invoice  # noqa: F401 - fails on purpose
