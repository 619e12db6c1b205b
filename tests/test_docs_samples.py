"""The sample runner (docs/run_samples.py) runs exactly the blocks a page marks, as marked.

The runner itself runs under ``make docs-check``; these tests pin down how it reads a page.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parent.parent / "docs" / "run_samples.py"


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("run_samples", RUNNER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _page(runner, tmp_path, monkeypatch, text):
    monkeypatch.setattr(runner, "DOCS", tmp_path)
    page = tmp_path / "page.md"
    page.write_text(text)
    return runner.samples(page)


def test_only_marked_blocks_are_samples(runner, tmp_path, monkeypatch):
    found = _page(runner, tmp_path, monkeypatch, (
        "```console\npip install django-sqlqueue\n```\n\n"
        "<!-- sample -->\n```console\npython manage.py migrate\n```\n"))
    assert [(s.kind, s.code) for s in found] == [("console", "python manage.py migrate\n")]


def test_a_titled_python_block_names_the_file_and_append_appends(runner, tmp_path, monkeypatch):
    found = _page(runner, tmp_path, monkeypatch, (
        '<!-- sample: append -->\n```python title="mysite/settings.py"\nX = 1\n```\n'
        '<!-- sample -->\n```python title="shop/queues.py"\nY = 2\n```\n'))
    assert [(s.title, s.append) for s in found] == [
        ("mysite/settings.py", True), ("shop/queues.py", False)]


def test_expect_keeps_its_text(runner, tmp_path, monkeypatch):
    found = _page(runner, tmp_path, monkeypatch,
                  "<!-- sample: expect hello, Ada -->\n\n```console\npython manage.py x\n```\n")
    assert found[0].expect == "hello, Ada"
    assert found[0].line == 3  # the block's first line, counted from 0: what an error names


def test_a_marker_without_a_block_is_an_error(runner, tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="not followed by a fenced block"):
        _page(runner, tmp_path, monkeypatch, "<!-- sample -->\nJust text.\n")


def test_every_tutorial_and_how_to_page_has_samples_and_is_in_the_nav(runner):
    for section in ("tutorial", "how-to"):
        pages = runner.nav_pages(section)
        assert pages, section
        for page in pages:
            assert runner.samples(page), f"{page.name} runs no sample"
