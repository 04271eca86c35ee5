"""Griffe extension for the API reference (docs/guide/api.md): Sphinx roles as code.

pybk's docstrings name other objects with Sphinx's roles (``:class:`BookKeeper```,
``:func:`~pybk.log.wal.open```), which Markdown would show as they are typed.  Before
mkdocstrings renders a docstring, each role becomes a code span of the name (``~``: its
last part, as Sphinx shows it).  Plain code spans rather than cross-references: a
reference to an object the API page does not document would fail the strict build.
Declared in mkdocs.yml (mkdocstrings' ``extensions`` option).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|exc|obj):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    short, name = match.groups()
    return f"`{name.rpartition('.')[2] if short else name}`"


def markdown_names(text: str) -> str:
    """``text`` with each Sphinx role turned into a Markdown code span."""
    return ROLE.sub(_code, text)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_names(obj.docstring.value)
