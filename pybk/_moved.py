"""Old import paths of modules that moved between packages, kept for one release.

pybk's modules moved into packages along the architecture's seams (:mod:`pybk.net`,
:mod:`pybk.autorecovery`, :mod:`pybk.admin`, :mod:`pybk.http`, :mod:`pybk.cli`,
:mod:`pybk.testing`).  Importing a module by its old path (``pybk.cluster.local``) warns
with a :class:`DeprecationWarning` naming the new one and gives the module at its new
path (``pybk.testing.local_cluster``): the same module object, so that ``isinstance``,
monkeypatching and the module's own state are shared by both names.  The old paths go
in the release after next.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any, Sequence

#: Old module path -> new module path.
MOVED_MODULES = {
    "pybk.child": "pybk.cluster.child",
    "pybk.cluster.admin_commands": "pybk.admin.commands",
    "pybk.cluster.admin_inspect": "pybk.admin.inspect",
    "pybk.cluster.auditor": "pybk.autorecovery.auditor",
    "pybk.cluster.autorecovery": "pybk.autorecovery.service",
    "pybk.cluster.client": "pybk.net.client",
    "pybk.cluster.commands": "pybk.cli.cluster",
    "pybk.cluster.connect": "pybk.net.connect",
    "pybk.cluster.curve": "pybk.net.curve",
    "pybk.cluster.deadlines": "pybk.net.deadlines",
    "pybk.cluster.directory": "pybk.net.directory",
    "pybk.cluster.election": "pybk.autorecovery.election",
    "pybk.cluster.frames": "pybk.net.frames",
    "pybk.cluster.http_admin": "pybk.http.server",
    "pybk.cluster.http_endpoints": "pybk.http.endpoints",
    "pybk.cluster.ledger_check": "pybk.autorecovery.ledger_check",
    "pybk.cluster.local": "pybk.testing.local_cluster",
    "pybk.cluster.local_security": "pybk.testing.local_security",
    "pybk.cluster.mailbox": "pybk.net.mailbox",
    "pybk.cluster.processes": "pybk.testing.processes",
    "pybk.cluster.progress": "pybk.admin.progress",
    "pybk.cluster.recover_commands": "pybk.admin.recover",
    "pybk.cluster.replicas": "pybk.autorecovery.replicas",
    "pybk.cluster.replication_worker": "pybk.autorecovery.worker",
    "pybk.cluster.rereplication": "pybk.autorecovery.rereplication",
    "pybk.cluster.server": "pybk.net.server",
    "pybk.cluster.simpletest": "pybk.admin.simpletest",
    "pybk.cluster.throttle": "pybk.autorecovery.throttle",
    "pybk.cluster.wire": "pybk.net.wire",
    "pybk.cluster.zookeeper_server": "pybk.testing.zookeeper_server",
    "pybk.demo": "pybk.cli.demo",
    "pybk.metrics": "pybk.http.metrics",
    "pybk.offline_commands": "pybk.cli.offline",
    "pybk.tables": "pybk.cli.output",
    "pybk.tail_command": "pybk.cli.wal",
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} has moved to {new}; the old name is removed in the next "
                  f"release", DeprecationWarning, stacklevel=3)


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of :data:`MOVED_MODULES` (and nothing else)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder, replaced in sys.modules by exec_module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system takes the module from sys.modules after exec_module, so the
        # old name ends up bound to the new module itself.
        new = MOVED_MODULES[module.__name__]
        _warn(module.__name__, new)
        sys.modules[module.__name__] = importlib.import_module(new)


_FINDER = _MovedModules()


def install() -> None:
    """Put the finder of old paths on ``sys.meta_path`` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def moved_attribute(module: str, name: str, moved: dict[str, str]) -> Any:
    """For a package's ``__getattr__``: ``name`` of ``module``, which moved to the module
    ``moved[name]``, with a DeprecationWarning; AttributeError for any other name."""
    if name not in moved:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    _warn(f"{module}.{name}", f"{moved[name]}.{name}")
    return getattr(importlib.import_module(moved[name]), name)
