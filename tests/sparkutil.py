"""A real SparkSession in local mode for tests, stopped when the test module is done (the
module fixtures ``spark``, ``address`` and ``bk`` in conftest.py use it).

PySpark workers run this interpreter (PYSPARK_PYTHON) with this source tree on their
path, bind to loopback, and Spark's UI and event logs stay off; the session is small
(2 cores, few shuffle partitions) so that a test module starts it once in a few seconds.

Every Spark JVM of the tests (these sessions, and the drivers and executors of the
scripts the tests run: :func:`script_env`) runs with :data:`JVM_OPTIONS`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPOSITORY = str(Path(__file__).resolve().parent.parent)

#: The tests' Spark applications live seconds and handle kilobytes: compiling hot code
#: with the client compiler only (no C2 compiler threads) and collecting a small heap
#: with one thread halves the CPU a JVM takes to start and run them, which on a 2-core
#: machine is most of a Spark test's time.  What Spark and pybk do is the same.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def script_env() -> dict[str, str]:
    """The environment of a script that builds its own SparkSession as a user's does
    (an example, a README block): its Python workers run this interpreter, on loopback,
    and its JVMs (the driver, and the executors of a ``local-cluster`` master) take
    :data:`JVM_OPTIONS` through ``PYSPARK_SUBMIT_ARGS``, as a user's ``spark-submit
    --conf`` would give them."""
    submit = " ".join(f"--conf '{key}={JVM_OPTIONS}'" for key in (
        "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"))
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
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
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

