"""pybk logs in Spark jobs: the ``pybk`` data source (batch and streaming reads and
exactly-once writes) and bookies hosted by Spark executors.

``pybk.spark.register(spark)`` makes ``spark.read.format("pybk")`` (and ``readStream``,
``write``, ``writeStream``) available in a SparkSession; ``with
pybk.spark.executor_bookies(spark, "zk://...")`` runs bookies on the application's
executors while it is open (:mod:`pybk.spark.bookies`).  Both run pybk's Python workers
with the interpreter that called them in local mode, or check that Spark's can import
pybk (:mod:`pybk.spark.workers`).  Needs ``pip install "pybk[spark]"`` (pyspark 4 with
pyarrow).  Options: :mod:`pybk.spark.options`; rows: :mod:`pybk.spark.source`.

May import: the base modules, the library's packages up to :mod:`pybk.log`
(docs/DESIGN.md, "Layers").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pybk.spark import workers
from pybk.spark.bookies import ExecutorBookies, HostedBookie, executor_bookies
from pybk.spark.source import NAME, SCHEMA, PybkDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["NAME", "SCHEMA", "ExecutorBookies", "HostedBookie", "PybkDataSource",
           "executor_bookies", "register"]


def register(spark: "SparkSession") -> None:
    """Register the ``pybk`` data source in ``spark`` (again: no change), its workers
    running :func:`pybk.spark.workers.worker_python`: in local mode without
    ``PYSPARK_PYTHON``, this interpreter.  Raises InvalidConfiguration if the workers'
    interpreter cannot import pybk.  In a Spark Connect session the server decides."""
    from pyspark.sql.session import SparkSession as ClassicSession
    if not isinstance(spark, ClassicSession):  # Spark Connect: no SparkContext here
        spark.dataSource.register(PybkDataSource)
        return
    sc = spark.sparkContext
    with workers.running(sc, workers.worker_python(sc)):
        spark.dataSource.register(PybkDataSource)
