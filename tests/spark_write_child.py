"""A Spark driver for tests to kill: writes rows to a pybk log with a writer whose commit
blocks, after saying so in a marker file.

    python tests/spark_write_child.py ADDRESS LOG MARKER

The test waits for the marker (every task of the job is done, the commit has started and
will not finish) and kills this process's group with SIGKILL: the driver dies between
its tasks and its commit, as a driver that crashes there would.  The marker holds the
job's id and the pid of the Python process running the commit (Spark's Python workers
have a process group of their own), which the test kills too.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sparkutil import spark_session

from pybk.spark.batch_write import BatchWriter
from pybk.spark.source import PybkDataSource

#: How long the blocked commit waits to be killed before giving up (the test kills it
#: long before; this only bounds a child left behind by a broken test).
BLOCK_S = 120.0


class BlockingWriter(BatchWriter):
    marker = ""

    def commit(self, messages):
        written = Path(self.marker + ".tmp")
        written.write_text(f"{self.job_id} {os.getpid()}")
        written.replace(self.marker)  # whole, or not at all
        time.sleep(BLOCK_S)
        raise SystemExit("the test did not kill this driver")


class BlockingSource(PybkDataSource):
    @classmethod
    def name(cls) -> str:
        return "pybk_blocking_commit"

    def writer(self, schema, overwrite):
        from pybk.spark.options import WRITE, parse
        writer = BlockingWriter(parse(self.options, WRITE), schema, overwrite)
        writer.marker = os.environ["PYBK_TEST_MARKER"]  # inherited by Spark's workers
        return writer


if __name__ == "__main__":
    address, log_name, os.environ["PYBK_TEST_MARKER"] = sys.argv[1:4]
    with spark_session("local[2]") as spark:
        spark.dataSource.register(BlockingSource)
        rows = spark.range(1000, numPartitions=4).selectExpr(
            "cast(cast(id as string) as binary) as value")
        rows.write.format("pybk_blocking_commit").option("metadataServiceUri", address) \
            .option("log", log_name).mode("append").save()
