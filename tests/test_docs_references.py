"""What the package tells a user to read exists, and needs no checkout.

A pip user has no ``docs/`` folder: hints and errors name a page and a section by title,
with the page's address (``django_sqlqueue.docs.see``). These tests read the package's
source, so a new hint cannot point at a file path or at a section that was renamed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from django_sqlqueue import docs

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_sqlqueue"
DOCS = ROOT / "docs"
SEE_CALL = re.compile(r"""\bsee\(\s*["']([\w-]+)["']\s*,\s*["']([^"']+)["']\s*\)""")
FILE_PATH = re.compile(r"(?<![/\w])docs/[\w-]+\.md")


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def _headings(page: str) -> set[str]:
    text = (DOCS / f"{page}.md").read_text()
    return {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}


def _string_constants(tree: ast.AST) -> list[str]:
    """Every string literal but docstrings: what the package may show a user."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_every_page_a_hint_names_has_its_title():
    for page, title in docs.PAGES.items():
        first = (DOCS / f"{page}.md").read_text().splitlines()[0]
        assert first == f"# {title}", f"docs/{page}.md starts {first!r}"


@pytest.mark.parametrize("source", _sources(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_hints_name_sections_that_exist_and_no_file_paths(source):
    text = source.read_text()
    for page, section in SEE_CALL.findall(text):
        assert page in docs.PAGES, f"{source.name}: see({page!r}, ...) names no known page"
        assert section in _headings(page), f"{source.name}: no section {section!r} in {page}.md"
    for value in _string_constants(ast.parse(text)):
        assert not FILE_PATH.search(value), (
            f"{source.name}: {value!r} points to a file a pip user does not have")


def test_see_gives_the_section_the_page_and_its_address():
    assert docs.see("tasks", "Settings") == (
        f"See 'Settings' in Django Tasks on the queue ({docs.DOCS_URL}/tasks.md).")


def test_the_quickstart_lists_every_table_migrate_creates():
    from django.apps import apps

    tables = {model._meta.db_table for model in apps.get_app_config("django_sqlqueue").get_models()
              if model._meta.managed}
    text = (DOCS / "quickstart.md").read_text()
    listed = text[text.index("This creates the queue's tables"):text.index("describes them")]
    assert set(re.findall(r"`(queue_\w+)`", listed)) == tables
