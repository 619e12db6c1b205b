"""pytest fixtures for projects using django-sqlqueue (the ``sqlqueue`` pytest11 entry
point, so installing the package is enough).

Nothing of Django is imported until a fixture is used: pytest loads this plugin in every
project of the environment, configured for Django or not, with pytest-django or not.

- ``sqlqueue_captured``: a :class:`~django_sqlqueue.testing.Captured` recording the test's
  publishes and task enqueues.
- ``sqlqueue_drain``: :func:`~django_sqlqueue.testing.drain`, to call with its arguments.

Both need database access as usual (pytest-django's ``db`` fixture or ``django_db`` mark).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from . import Captured, DrainResult


@pytest.fixture
def sqlqueue_captured() -> Iterator[Captured]:
    """What the test publishes (and enqueues), as ``captured()`` records it."""
    from . import captured

    with captured() as box:
        yield box


@pytest.fixture
def sqlqueue_drain() -> Callable[..., DrainResult]:
    """``drain()``: run the subscribers and tasks here until nothing is due."""
    from . import drain

    run: Callable[..., Any] = drain
    return run
