"""Where the documentation lives, for hints and errors that point a reader to it.

An installed package has no ``docs/`` folder, so a hint names the page and the section by
their titles, with the page's address.
"""

from __future__ import annotations

DOCS_URL = "https://github.com/django-sqlqueue/django-sqlqueue/blob/main/docs"

# The documentation's pages by file name, with their titles.
PAGES = {
    "consuming": "Consuming messages",
    "quickstart": "Quickstart",
    "scheduling": "Recurring schedules",
    "tasks": "Django Tasks on the queue",
    "operating": "Operating the queue",
}


def see(page: str, section: str) -> str:
    """``See 'Section' in Page title (https://.../page.md).``"""
    return f"See '{section}' in {PAGES[page]} ({DOCS_URL}/{page}.md)."
