"""The Python interpreter of pybk's code in Spark's Python workers, and a check, once, that
it imports pybk.

How PySpark picks a worker's interpreter (PySpark 4)
    The Python side of Spark hands the JVM each function to run together with an
    interpreter, ``SparkContext.pythonExec``, which PySpark reads once, from the
    ``PYSPARK_PYTHON`` environment variable, when the SparkContext is made; unset, it is
    ``python3``, found on each host's PATH.  (``spark.pyspark.python`` reaches it only
    through ``spark-submit`` of a Python file, which exports it as ``PYSPARK_PYTHON`` to
    the driver; set in a session builder, or ``PYSPARK_PYTHON`` set once the session
    exists, it changes nothing.)  A Python data source keeps the interpreter of its
    registration for every worker it needs: the planner processes on the driver, the
    streaming source and commit processes, and its tasks' readers and writers
    (``UserDefinedPythonDataSource`` hands its own to each); an RDD's function keeps
    the one of when the RDD's Java side is made.  So ``.venv/bin/python job.py`` with
    the venv not activated ran pybk's workers with another ``python3``, which could not
    import pybk.

What pybk does (:func:`worker_python`)
    * In local mode (``local``, ``local[N]``, ``local-cluster[...]``: every worker runs
      on this host) with ``PYSPARK_PYTHON`` unset, pybk's workers run this interpreter
      (``sys.executable``), which runs pybk already.  The context keeps its own for
      everything else (other data sources, UDFs).
    * Otherwise they run Spark's: ``PYSPARK_PYTHON`` as given, or ``python3`` on a
      cluster, where this process's interpreter may not exist on the executors.  If that
      is not this interpreter, it is checked once per process and interpreter, on the
      driver, before any task runs: ``<python> -c "import pybk, pyarrow"`` in this
      process's environment (which Spark's workers inherit, with pyspark added).  One
      that fails raises :class:`~pybk.errors.InvalidConfiguration` saying what to set.
      On a cluster the check covers the driver's host, where the data source's planner
      runs; the executors' interpreter needs pybk too (:mod:`pybk.spark.bookies` names
      a holder's import error when it does not).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Iterator

from pybk.errors import InvalidConfiguration

if TYPE_CHECKING:
    from pyspark import SparkContext

#: ``SparkContext.pythonExec`` when ``PYSPARK_PYTHON`` is not set.
SPARK_DEFAULT_PYTHON = "python3"
#: What the check imports: pybk, and pyarrow, which the data source's workers need.
CHECK_IMPORTS = "import pybk, pyarrow"
#: Bound on the check's interpreter start and imports (a loaded machine takes seconds).
CHECK_TIMEOUT_S = 60.0

_checked: set[str] = set()
_checked_lock = threading.Lock()


def worker_python(sc: "SparkContext") -> str:
    """The interpreter pybk's functions run with in ``sc``'s Python workers (see the
    module docstring); raises InvalidConfiguration if it is not this interpreter and
    cannot import pybk."""
    chosen = sc.pythonExec
    master = sc.master or ""
    if chosen == SPARK_DEFAULT_PYTHON and master.startswith("local"):
        return sys.executable
    found = shutil.which(chosen)
    if found is None or os.path.abspath(found) != os.path.abspath(sys.executable):
        _check(chosen)
    return chosen


@contextlib.contextmanager
def running(sc: "SparkContext", python: str) -> Iterator[None]:
    """Functions that PySpark hands the JVM inside (a data source registered, an RDD's
    Java side made) run with ``python``.  Another thread handing one over meanwhile gets
    ``python`` too: pybk sets only this interpreter, on this host, in its place."""
    saved = sc.pythonExec
    sc.pythonExec = python
    try:
        yield
    finally:
        sc.pythonExec = saved


def _check(python: str) -> None:
    with _checked_lock:
        if python in _checked:
            return
    how = ("PYSPARK_PYTHON" if python != SPARK_DEFAULT_PYTHON else
           "PySpark's default, as PYSPARK_PYTHON is not set")
    try:
        result = subprocess.run([python, "-c", CHECK_IMPORTS], capture_output=True,
                                text=True, stdin=subprocess.DEVNULL,
                                timeout=CHECK_TIMEOUT_S)
    except OSError as e:
        failure = f"it cannot be run ({e.strerror or e})"
    except subprocess.TimeoutExpired:
        failure = f"{CHECK_IMPORTS!r} did not finish within {CHECK_TIMEOUT_S:.0f} s"
    else:
        if result.returncode == 0:
            with _checked_lock:
                _checked.add(python)
            return
        lines = result.stderr.strip().splitlines() or [f"exit status {result.returncode}"]
        failure = f"{CHECK_IMPORTS!r} fails: {lines[-1]}"
    raise InvalidConfiguration(
        f"Spark's Python workers run {python!r} ({how}), and {failure}: set "
        f"PYSPARK_PYTHON to an interpreter with pybk (this one is {sys.executable}) "
        "before the SparkSession is built, or install pybk there")
