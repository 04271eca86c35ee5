"""The ``pybk`` command in a child process, running the same pybk as this process.

``pybk demo`` and :class:`~pybk.testing.local_cluster.LocalCluster` start ``python -m pybk ...``
children.  Plain ``python -m`` puts the current directory first on the module path, so a
directory named ``pybk`` there would shadow the pybk this process runs: a clone of the
repository (a namespace package without ``open``), or another version of it.  So the
child runs with ``-P`` (Python 3.11+: nothing is put before the path) and with the
directory this pybk was imported from first on ``PYTHONPATH``, whether pybk is installed
or run from a source tree.
"""

from __future__ import annotations

import os
import sys


def command(*args: str) -> list[str]:
    """The argument list that runs ``pybk *args`` under this interpreter; run it with
    :func:`environment`."""
    return [sys.executable, "-P", "-m", "pybk", *args]


def environment() -> dict[str, str]:
    """This process's environment, with this pybk's directory first on ``PYTHONPATH``."""
    # This file is <source>/pybk/cluster/child.py.
    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=source + (os.pathsep + path if path else ""))
