"""The package's shape: modules that do not import each other in a ring, a public API
(``consuming``) that does not reach into the worker, and modules small enough to hold
one concern.

No database here: the import graph is read from the source with ``ast``. Every import
counts, including those under ``TYPE_CHECKING`` and inside functions: a ring that only
type checking or a late import closes is still a ring for a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_sqlqueue"
MAX_LINES = 450  # a module past this probably owns two things


def modules() -> dict[str, Path]:
    """Dotted module name → file, migrations left out (generated)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "migrations" in parts:
            continue
        name = ".".join(parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imported(source: str, package: str) -> set[str]:
    """Every module name an import in ``source`` may load, for a module of ``package``:
    ``from . import x`` loads both the package and its module ``x``; ``from .x import name``
    loads ``x`` (and the module ``x.name`` when there is one)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.update([target, *(f"{target}.{alias.name}" for alias in node.names)])
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Each module → the package's modules it imports."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {t for t in imported(path.read_text(), package) if t in known and t != name}
    return graph


def rings(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others() -> None:
    assert rings(import_graph()) == []


def test_the_public_consuming_api_does_not_import_the_worker() -> None:
    graph = import_graph()
    reaching = sorted(
        (name, target) for name, targets in graph.items()
        if name.startswith("django_sqlqueue.consuming")
        for target in targets if target.startswith("django_sqlqueue.worker")
    )
    assert reaching == []


def test_no_module_is_longer_than_one_concern_needs() -> None:
    lengths = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def test_imports_under_type_checking_and_in_functions_count() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..worker.partitions import Partition\n"
        "def register():\n"
        "    from .source import DataSource\n"
    )
    found = imported(source, "django_sqlqueue.spark")
    assert {"django_sqlqueue.worker.partitions", "django_sqlqueue.spark.source"} <= found
