"""PostgreSQL array literals, for statements that take a whole batch as a few parameters.

A statement that names each row of a batch with its own placeholders (``VALUES (%s, %s),
...`` or ``IN (%s, %s, ...)``) costs on both sides: psycopg parses the text afresh every
time it has more than 50 parameters and quotes each one in Python, and the server parses
and plans a new, long text. Passing each column of the batch as one array parameter
(``unnest(%s::text[], %s::bigint[])``) keeps the text the same for every batch size.

psycopg adapts a Python list to an array too, but element by element in Python; building
the literal here is a few times cheaper, and exact: every element is quoted, so a string
holding a comma, a brace, a quote or the word ``NULL`` reads back as itself.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["int_array", "text_array"]


def int_array(values: Iterable[int]) -> str:
    """``{1,2,3}``: bind it as ``%s::bigint[]``."""
    return "{" + ",".join([str(int(value)) for value in values]) + "}"


def text_array(values: Iterable[str]) -> str:
    """``{"a","b"}``: bind it as ``%s::text[]``."""
    return "{" + ",".join([_quoted(value) for value in values]) + "}"


def _quoted(value: str) -> str:
    if "\\" in value or '"' in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + value + '"'
