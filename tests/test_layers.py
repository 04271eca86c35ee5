"""The layers of docs/DESIGN.md, checked on the imports of every module of pybk.

The order of the layers is read from one place: the first code block of DESIGN.md's
``## Layers`` section, lowest layer first.  Only its left column is read (a line's text
before its first run of two spaces or more): a path starts a layer, either a package
(``pybk/storage/``: every module under it) or a module (``pybk/errors.py``), and the
bare module names after it (``settings.py``, also on the lines indented under it) join
that layer, from the same directory.  Every module of pybk must be in a layer, so the
block cannot leave one out.

The imports of a module are read with :mod:`ast` (nothing of pybk is imported): those
at module level, the deferred ones (inside a function) and the type-only ones (under
``if TYPE_CHECKING:``).  All count, for both rules:

- a module imports only modules of its own layer or of the layers before it;
- no module imports itself through others (a cycle, of any length).

Deferred and type-only imports count because a cycle hidden behind them is still a
knot: modules that cannot be read, tested or moved one without the other.
``import a.b`` and ``from a.b import c`` are an import of ``a.b`` (or of ``a.b.c`` when
that is a module); importing a package is an import of its ``__init__``, so of the
modules that one imports.  Not counted: the packages Python imports on the way to a
module (``a`` for ``a.b``: every module would otherwise import ``pybk/__init__.py``,
which imports most of pybk), and imports by name at run time
(``importlib.import_module``, as :mod:`pybk._moved` does for old import paths).
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "DESIGN.md"
#: A name of the layer block's left column: ``pybk/x/`` or ``[pybk/]x.py``.
_LAYER_NAME = re.compile(r"(?:[\w.]+/)*[\w.]+(?:/|\.py)")
#: The kinds of import, by the place the statement is in.
_KINDS = ("module-level", "deferred", "type-only")


@dataclass(frozen=True)
class Import:
    """One import statement's edge: ``source`` imports ``target`` at ``line``."""
    source: str
    target: str
    path: str  # the source's file, relative to the directory holding the package
    line: int
    kind: str  # one of _KINDS

    def where(self) -> str:
        return f"{self.path}:{self.line} ({self.kind} import of {self.target})"


@dataclass(frozen=True)
class Layer:
    """One layer of the block: the name that starts it, the packages it holds whole
    and its single modules."""
    title: str
    packages: tuple[str, ...]  # dotted names; every module under them is of this layer
    modules: tuple[str, ...]  # dotted names of single modules


def read_layers(markdown: str) -> list[Layer]:
    """The layers of the ``## Layers`` section's first code block, lowest first."""
    section = markdown.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```\n", 2)[1]
    layers: list[Layer] = []
    for line in block.splitlines():
        left = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        for name in _LAYER_NAME.findall(left):
            if "/" in name.rstrip("/"):
                layers.append(Layer(name, (), ()))
                directory = name.rsplit("/", 1)[0]
            elif not layers:
                raise AssertionError(f"DESIGN.md's layer block starts with {name!r}, "
                                     f"not a path in pybk")
            else:
                name = f"{directory}/{name}"
            last = layers[-1]
            if name.endswith("/"):
                dotted = name.rstrip("/").replace("/", ".")
                layers[-1] = Layer(last.title, last.packages + (dotted,), last.modules)
            else:
                dotted = name.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
                layers[-1] = Layer(last.title, last.packages, last.modules + (dotted,))
    return layers


def find_modules(package: Path) -> dict[str, Path]:
    """The dotted name of every module under the package directory ``package`` (a
    package's ``__init__.py`` has the package's name), to its file."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


class _Imports(ast.NodeVisitor):
    """The imports of one module, each with the kind of place it is in."""

    def __init__(self, name: str, path: str, is_package: bool, known: set[str]) -> None:
        self.name, self.path, self.known = name, path, known
        # The package that relative imports start from.
        self.package = name if is_package else name.rpartition(".")[0]
        self.kind = "module-level"
        self.found: list[Import] = []

    def _in(self, kind: str, nodes: list[ast.stmt]) -> None:
        # Nested places: type-only (never run) over deferred (run later) over module level.
        outer, self.kind = self.kind, max(self.kind, kind, key=_KINDS.index)
        for node in nodes:
            self.visit(node)
        self.kind = outer

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._in("type-only", node.body)
            for other in node.orelse:
                self.visit(other)
        else:
            self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._in("deferred", node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _module(self, dotted: str) -> str | None:
        # `import a.b.c` where c is not a module (cannot happen in Python, but a
        # `from a.b import c` of a name resolves here too): the longest module prefix.
        while dotted and dotted not in self.known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def _add(self, target: str | None, node: ast.stmt) -> None:
        found = Import(self.name, target or "", self.path, node.lineno, self.kind)
        if target is not None and target != self.name and found not in self.found:
            self.found.append(found)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(self._module(alias.name), node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[:len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        for alias in node.names:
            submodule = f"{origin}.{alias.name}"
            self._add(submodule if submodule in self.known else self._module(origin), node)


def read_imports(modules: dict[str, Path], root: Path) -> list[Import]:
    """Every import, by one module of ``modules``, of another; paths relative to
    ``root``, the directory holding the package."""
    known = set(modules)
    found = []
    for name, path in modules.items():
        visitor = _Imports(name, str(path.relative_to(root)), path.name == "__init__.py",
                           known)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        found.extend(visitor.found)
    return found


def layer_of(module: str, layers: list[Layer]) -> int | None:
    """The index in ``layers`` of the one naming ``module`` or a package holding it
    (the innermost, should two name it)."""
    best, depth = None, -1
    for index, layer in enumerate(layers):
        if module in layer.modules:
            return index
        for package in layer.packages:
            if (module == package or module.startswith(package + ".")) \
                    and package.count(".") > depth:
                best, depth = index, package.count(".")
    return best


def upward_imports(imports: list[Import], layers: list[Layer]) -> list[str]:
    """A message for every import of a module of a layer above the importer's."""
    found = []
    for edge in imports:
        source, target = layer_of(edge.source, layers), layer_of(edge.target, layers)
        if source is not None and target is not None and target > source:
            found.append(f"{edge.where()}: {edge.source} is in layer "
                         f"{layers[source].title!r}, {edge.target} in "
                         f"{layers[target].title!r} above it; a module imports only "
                         f"its own layer and those below it (docs/DESIGN.md, Layers)")
    return found


def cycles(imports: list[Import]) -> list[list[Import]]:
    """One cycle of imports through each set of modules that import each other, directly
    or through others (each strongly connected component of more than one module)."""
    graph: dict[str, list[Import]] = {}
    for edge in imports:
        graph.setdefault(edge.source, []).append(edge)
    reached = {module: _reachable(graph, module) for module in graph}
    found, seen = [], set()
    for module in sorted(graph):
        if module in seen or module not in reached[module]:
            continue
        component = sorted(other for other in reached[module]
                           if module in reached.get(other, ()))
        seen.update(component)
        found.append(_cycle_through(component, graph))
    return found


def _reachable(graph: dict[str, list[Import]], start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others (itself only if it is
    on a cycle)."""
    reached: set[str] = set()
    todo = [start]
    while todo:
        for edge in graph.get(todo.pop(), ()):
            if edge.target not in reached:
                reached.add(edge.target)
                todo.append(edge.target)
    return reached


def _cycle_through(component: list[str], graph: dict[str, list[Import]]) -> list[Import]:
    """The shortest cycle from the first module of ``component`` back to it."""
    members, start = set(component), component[0]
    came_by: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for edge in graph.get(node, ()):
                if edge.target not in members or edge.target in came_by:
                    continue
                came_by[edge.target] = edge
                if edge.target == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, came_by[path[0].source])
                    return path
                following.append(edge.target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in its component {component}")


def describe(cycle: list[Import]) -> str:
    """A cycle as a message: each module and the import that leads to the next."""
    return ("cycle: " + " -> ".join(
        [cycle[0].source] + [f"{edge.target} [{edge.where()}]" for edge in cycle])
        + "; untie it by moving what both sides need to the lower one (docs/DESIGN.md, "
        "Layers)")


@functools.cache  # parsing every module takes seconds on a loaded machine: once
def _pybk() -> tuple[dict[str, Path], list[Import], list[Layer]]:
    modules = find_modules(ROOT / "pybk")
    return (modules, read_imports(modules, ROOT),
            read_layers(DESIGN.read_text(encoding="utf-8")))


def test_design_puts_every_module_in_one_layer() -> None:
    modules, _, layers = _pybk()
    assert len(layers) > 10, f"docs/DESIGN.md's layer block read as {layers}"
    named = [name for layer in layers for name in layer.packages + layer.modules]
    unknown = [name for name in named if name not in modules]
    assert not unknown, f"docs/DESIGN.md's layer block names {unknown}: no module or " \
                        "package of pybk"
    twice = sorted({name for name in named if named.count(name) > 1})
    assert not twice, f"docs/DESIGN.md's layer block names {twice} twice"
    left_out = [name for name in modules if layer_of(name, layers) is None]
    assert not left_out, f"{left_out}: in no layer of docs/DESIGN.md's layer block"


def test_no_module_imports_a_layer_above_its_own() -> None:
    _, imports, layers = _pybk()
    upward = upward_imports(imports, layers)
    assert not upward, "\n".join(upward)


def test_no_modules_import_each_other() -> None:
    _, imports, _ = _pybk()
    found = [describe(cycle) for cycle in cycles(imports)]
    assert not found, "\n".join(found)


def test_the_checker_finds_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    """The checker itself, on a package of its own: each kind of import is read, an
    upward one is reported, and so is a cycle through a package's ``__init__``."""
    files = {
        "top/__init__.py": "",
        "top/base.py": "import top.low.a\n",  # up, from the base layer
        "top/low/__init__.py": "from top.low.a import A\n",
        "top/low/a.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from ..high import b
            class A: ...
        """,
        "top/high/__init__.py": "",
        "top/high/b.py": """
            def later():
                from top import low
        """,
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    modules = find_modules(tmp_path / "top")
    imports = read_imports(modules, tmp_path)
    layers = read_layers(textwrap.dedent("""
        ## Layers
        ```
        top/base.py       the bottom
          other.py        (one that does not exist)
        top/low/          the middle
        top/high/         above it
        top/__init__.py   the facade
        ```
        ## Next
    """))
    assert [(layer.packages, layer.modules) for layer in layers] == [
        ((), ("top.base", "top.other")), (("top.low",), ()), (("top.high",), ()),
        ((), ("top",))]
    assert sorted((edge.source, edge.target, edge.line, edge.kind) for edge in imports) == [
        ("top.base", "top.low.a", 1, "module-level"),
        ("top.high.b", "top.low", 3, "deferred"),
        ("top.low", "top.low.a", 1, "module-level"),
        ("top.low.a", "top.high.b", 4, "type-only")]
    upward = upward_imports(imports, layers)
    assert len(upward) == 2
    assert upward[0].startswith("top/base.py:1 (module-level import of top.low.a): ")
    assert upward[1].startswith("top/low/a.py:4 (type-only import of top.high.b): ")
    assert "'top/low/' above" not in upward[1] and "'top/high/' above" in upward[1]
    [cycle] = cycles(imports)
    assert describe(cycle).startswith(
        "cycle: top.high.b -> top.low [top/high/b.py:3 (deferred import of top.low)]"
        " -> top.low.a [top/low/__init__.py:1 (module-level import of top.low.a)]"
        " -> top.high.b [top/low/a.py:4 (type-only import of top.high.b)]; ")


# -- what importing pybk costs a process ------------------------------------------------

def test_importing_pybk_leaves_out_what_only_some_processes_need() -> None:
    """``import pybk`` (every ``pybk`` command, bookie and Spark worker pays it at start)
    imports neither the metrics library (a client imports it when given a registry) nor
    the installed distributions' metadata (pybk.checksum takes the ``crc32c`` package's C
    function without the package's ``__init__``, which reads it)."""
    code = ("import sys, pybk\n"
            "print(sorted(m for m in ('prometheus_client', 'importlib.metadata', 'email')"
            " if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_checksum_is_the_crc32c_packages_function() -> None:
    import crc32c as package

    from pybk.checksum import crc32c
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"6789", crc32c(b"12345")) == 0xE3069283
    assert crc32c is package.crc32c  # one extension module, also once the package loads
