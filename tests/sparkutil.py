"""A real SparkSession in local mode for tests: one a test worker, shared by its Spark test
modules (:class:`WorkerSessions`; the fixtures ``spark``, ``spark_conf`` and
``spark_sessions`` in conftest.py), and left by each test as it found it
(:func:`left_as_found`).

PySpark workers run this interpreter (PYSPARK_PYTHON) with this source tree on their
path, bind to loopback, and Spark's UI and event logs stay off; the session is small
(2 cores, few shuffle partitions): it starts in a few seconds, once a worker unless a
module asks for another master or conf.

Every Spark JVM of the tests (these sessions, and the drivers and executors of the
scripts the tests run: :func:`script_env`) runs with :data:`JVM_OPTIONS`, and maps its
classes from the Spark class archive once ``make test`` made it (tests/jvm_archives.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import jvm_archives

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPOSITORY = str(Path(__file__).resolve().parent.parent)

#: The tests' Spark applications live seconds and handle kilobytes: compiling hot code
#: with the client compiler only (no C2 compiler threads) and collecting a small heap
#: with one thread halves the CPU a JVM takes to start and run them, which on a 2-core
#: machine is most of a Spark test's time.  What Spark and pybk do is the same.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


#: What the tests' sessions (:func:`spark_session`) and the scripts' own set: no web
#: UI (a Jetty server per application) and few shuffle partitions (they shuffle
#: kilobytes; Spark's 200 are 200 tasks).  A tenth less CPU per script's application.
SCRIPT_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}


def script_env() -> dict[str, str]:
    """The environment of a script that builds its own SparkSession as a user's does
    (an example, a README block): its Python workers run this interpreter, on loopback,
    and its JVMs (the driver, and the executors of a ``local-cluster`` master) take
    :data:`JVM_OPTIONS`, the Spark class archive's options and :data:`SCRIPT_CONF` through
    ``PYSPARK_SUBMIT_ARGS``, as a user's ``spark-submit --conf`` would give them."""
    jvm = " ".join([JVM_OPTIONS, *jvm_archives.options("spark")])
    submit = " ".join(f"--conf '{key}={value}'" for key, value in (
        ("spark.driver.extraJavaOptions", jvm), ("spark.executor.extraJavaOptions", jvm),
        *SCRIPT_CONF.items()))
    return {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_SUBMIT_ARGS": f"{submit} pyspark-shell"}


def spark_env() -> dict[str, str]:
    """The environment Spark's JVM and Python workers need to run this tree's pybk."""
    path = os.environ.get("PYTHONPATH")
    return {
        **script_env(),
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": REPOSITORY + (os.pathsep + path if path else ""),
    }


@contextlib.contextmanager
def spark_session(master: str = "local[2]", **conf: str) -> Iterator["SparkSession"]:
    """A SparkSession with pybk's data source registered, stopped on exit."""
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    import pybk.spark
    builder = (SparkSession.builder.master(master).appName("pybk-tests")
               .config(map=SCRIPT_CONF)
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.execution.pyspark.udf.faulthandler.enabled", "true")
               .config("spark.python.worker.faulthandler.enabled", "true"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        pybk.spark.register(spark)
        yield spark
    finally:
        spark.stop()



class WorkerSessions:
    """The SparkSession of a test worker (a JVM holds one SparkContext at a time): started
    on first use with the master and conf a test module asks for, kept for every later
    module that asks for the same, started again only when one asks for another (a
    master with task retries, say), and stopped by :meth:`close`.  Its Spark scratch
    space (``spark.local.dir``) is ``local_dir``."""

    def __init__(self, local_dir: str | os.PathLike) -> None:
        self._local_dir = str(local_dir)
        self._key: tuple | None = None
        self._session: contextlib.ExitStack | None = None
        self._spark: "SparkSession | None" = None

    def get(self, master: str = "local[2]", **conf: str) -> "SparkSession":
        """The worker's session with this master and conf."""
        key = (master, sorted(conf.items()))
        if key != self._key or self._spark is None:
            self.close()
            stack = contextlib.ExitStack()
            self._spark = stack.enter_context(spark_session(
                master, **{"spark.local.dir": self._local_dir, **conf}))
            self._session, self._key = stack, key
        return self._spark

    def close(self) -> None:
        """Stop the session (if one runs)."""
        stack, self._session, self._spark, self._key = self._session, None, None, None
        if stack is not None:
            stack.close()


@contextlib.contextmanager
def left_as_found(spark: "SparkSession") -> Iterator[None]:
    """Around a test that shares ``spark``: afterwards its runtime conf is as before (keys
    set are unset, values changed are put back), its temporary views (a memory sink's
    table, say) are dropped and no job group is set; a streaming query still running is
    stopped and fails the test that left it."""
    before = dict(spark.conf.getAll)
    yield
    running = [query.name or str(query.id) for query in spark.streams.active]
    for query in spark.streams.active:
        query.stop()
    for table in spark.catalog.listTables():
        if table.isTemporary:
            spark.catalog.dropTempView(table.name)
    spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    after = dict(spark.conf.getAll)
    for key in after.keys() - before.keys():
        spark.conf.unset(key)
    for key, value in before.items():
        if after.get(key) != value:
            spark.conf.set(key, value)
    assert not running, f"the test left streaming queries running: {running}"
