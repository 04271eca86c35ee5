"""MkDocs hook: the settings reference (docs/guide/settings.md) and the Spark data source's
options (docs/guide/spark.md), generated from the code.

pybk's settings classes are frozen dataclasses whose fields are documented by ``#:``
comment lines right above each field (Sphinx's convention for attribute docs, which
Python keeps no trace of at run time).  So that the reference cannot drift from the code,
a page names a class in a marker line and this hook puts a table there when the site is
built:

    <!-- settings-table pybk.settings.ServerSettings -->
    <!-- settings-mapping pybk.settings.WAL_SERVER_DEFAULTS -->
    <!-- options-table pybk.spark.options.OPTIONS -->

``settings-table`` gives one row per field, in the order of the source: its name, its
type (the annotation as written), its default (the dataclass's value) and its ``#:``
comment.  Consecutive fields under one comment (``zkRetryBackoffStartMs`` below
``zkOperationTimeoutMs``, ``ensembleSize``/``writeQuorumSize``/``ackQuorumSize``) share
it.  ``settings-mapping`` gives a module-level mapping of defaults (the embedded WAL's)
with the ``#:`` comment above it.  ``options-table`` gives the data source's options
(:class:`pybk.spark.options.Option` records: name, uses, default, documentation), in
their order.  A field without a comment, a marker naming nothing, or
a class that is not a dataclass fails the build (an error, whatever ``--strict`` says).

The comments are read with :mod:`ast` from the module's source file, the values from the
imported module: the build imports pybk (the repository's own, first on ``sys.path``).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import os
import re
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

_MARKER = re.compile(r"^<!-- (settings-table|settings-mapping|options-table) ([\w.]+) -->$",
                     re.M)
#: The data source's uses (pybk.spark.options.USES) as Spark's API names them.
SPARK_USES = {"read": "read", "stream_read": "readStream", "write": "write",
              "stream_write": "writeStream"}
# Sphinx roles (:class:`X`, :func:`X`, ...) as Markdown code spans.
_ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|exc):`~?([^`]+)`")


def _resolve(dotted: str) -> tuple[Any, Any]:
    """The module and the object a dotted name (``package.module.Name``) names."""
    module_name, _, name = dotted.rpartition(".")
    module = importlib.import_module(module_name)
    if not hasattr(module, name):
        raise ValueError(f"settings reference: {module_name} has no {name}")
    return module, getattr(module, name)


def _markdown(comment_lines: list[str]) -> str:
    """``#:`` lines as one Markdown paragraph fit for a table cell."""
    text = " ".join(line.strip()[2:].strip() for line in comment_lines)
    return _ROLE.sub(r"`\1`", text).replace("|", "\\|")


def _comment_above(source_lines: list[str], lineno: int) -> list[str]:
    """The ``#:`` lines right above line ``lineno`` (1-based), in order."""
    found: list[str] = []
    index = lineno - 2
    while index >= 0 and source_lines[index].strip().startswith("#:"):
        found.insert(0, source_lines[index])
        index -= 1
    return found


def field_docs(cls: type) -> list[tuple[str, str, str]]:
    """``(name, annotation, documentation)`` of each annotated field of ``cls``, in
    source order.  A field with no ``#:`` comment of its own shares the comment of the
    field on the line right above it; a field with neither raises ValueError."""
    path = inspect.getsourcefile(cls)
    assert path is not None
    with open(path, encoding="utf-8") as f:
        source = f.read()
    lines = source.splitlines()
    node = next(n for n in ast.walk(ast.parse(source))
                if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs: list[tuple[str, str, str]] = []
    previous: tuple[int, str] | None = None  # (line, documentation) of the field above
    for statement in node.body:
        if not (isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)):
            previous = None
            continue
        comment = _comment_above(lines, statement.lineno)
        if comment:
            doc = _markdown(comment)
        elif previous is not None and previous[0] == statement.lineno - 1:
            doc = previous[1]
        else:
            raise ValueError(f"settings reference: {cls.__name__}.{statement.target.id} "
                             f"has no #: comment ({path}:{statement.lineno})")
        annotation = ast.get_source_segment(source, statement.annotation) or ""
        docs.append((statement.target.id, annotation, doc))
        previous = (statement.end_lineno or statement.lineno, doc)
    return docs


def _value(value: Any) -> str:
    """A default as a code span, with sizes in KiB/MiB spelled out."""
    shown = f"`{value!r}`".replace("|", "\\|")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024:
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value % size == 0:
                return f"{shown} ({value // size} {unit})"
    return shown


def settings_table(dotted: str) -> str:
    """The reference of the settings class ``dotted``: its docstring and a table."""
    _, cls = _resolve(dotted)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"settings reference: {dotted} is not a dataclass")
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    rows = ["| setting | type | default | meaning |", "| --- | --- | --- | --- |"]
    documented = set()
    for name, annotation, doc in field_docs(cls):
        if name not in defaults:
            continue  # a ClassVar
        documented.add(name)
        rows.append(f"| `{name}` | `{annotation}` | {_value(defaults[name])} | {doc} |")
    missing = set(defaults) - documented
    if missing:
        raise ValueError(f"settings reference: {dotted} fields not found in its source: "
                         f"{sorted(missing)}")
    intro = _ROLE.sub(r"`\1`", inspect.cleandoc(cls.__doc__ or ""))
    return f"{intro}\n\n" + "\n".join(rows) + "\n"


def settings_mapping(dotted: str) -> str:
    """The module-level mapping of defaults ``dotted``: its ``#:`` comment and a table."""
    module, mapping = _resolve(dotted)
    name = dotted.rpartition(".")[2]
    path = inspect.getsourcefile(module)
    assert path is not None
    with open(path, encoding="utf-8") as f:
        source = f.read()
    statement = next(n for n in ast.parse(source).body
                     if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                     and n.target.id == name)
    comment = _comment_above(source.splitlines(), statement.lineno)
    if not comment:
        raise ValueError(f"settings reference: {dotted} has no #: comment")
    rows = ["| setting | default here |", "| --- | --- |"]
    rows += [f"| `{key}` | {_value(value)} |" for key, value in mapping.items()]
    return f"{_markdown(comment)}\n\n" + "\n".join(rows) + "\n"


def _option_default(value: Any) -> str:
    """An option's default as Spark takes it (empty: not set)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return '`""`' if value == "" else f"`{value}`"


def options_table(dotted: str) -> str:
    """The table of the data source's options ``dotted`` (a name -> Option dict)."""
    _, options = _resolve(dotted)
    rows = ["| option | applies to | default | meaning |", "| --- | --- | --- | --- |"]
    for option in options.values():
        uses = ", ".join(api for use, api in SPARK_USES.items() if use in option.uses)
        if not uses or not option.doc:
            raise ValueError(f"options reference: {option.name} has no uses or no doc")
        doc = _ROLE.sub(r"`\1`", option.doc).replace("|", "\\|")
        rows.append(f"| `{option.name}` | {uses} | {_option_default(option.default)} | {doc} |")
    return "\n".join(rows) + "\n"


_EXPAND = {"settings-table": settings_table, "settings-mapping": settings_mapping,
           "options-table": options_table}


def expand_markers(markdown: str) -> str:
    """``markdown`` with each marker line replaced by the table it names."""
    return _MARKER.sub(lambda match: _EXPAND[match.group(1)](match.group(2)), markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs' hook: each marker line of a page replaced by what it names."""
    return expand_markers(markdown)
