"""A griffe extension for the API reference: Sphinx roles in docstrings read as code.

The package's docstrings write ``:func:`cancel``` and ``:mod:`.limits``` as Sphinx would;
mkdocstrings renders Markdown, where the role would show as text.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|attr|data|exc|obj|const):(`[^`]+`)")


class SphinxRoles(Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(r"\1", obj.docstring.value)
