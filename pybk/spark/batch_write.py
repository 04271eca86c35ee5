"""``df.write.format("pybk")``: a batch write, committed to the log exactly once.

:class:`BatchWriter` is a DataSourceArrowWriter: tasks get Arrow batches and cut the
``value`` column's buffers into entries, with no Row object per record (measured with
1 KiB values, local[2]: see docs/guide/spark.md).  What each side does, and the
save modes: :mod:`pybk.spark.job_write`.

Spark builds the writer on the driver (where the job is begun, so a bad option or an
unreachable cluster fails before any task runs), pickles it to the tasks, and runs
``commit`` or ``abort`` with a pickled copy: the job id travels in the writer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pybk.spark import job_write
from pybk.spark.options import PybkOptions

if TYPE_CHECKING:
    import pyarrow as pa


class BatchWriter(DataSourceArrowWriter):
    """One write job on one log (see the module docstring)."""

    def __init__(self, opts: PybkOptions, schema: StructType, overwrite: bool) -> None:
        self.opts = opts
        self.overwrite = overwrite
        self.job_id = job_write.begin(opts)

    def write(self, iterator: Iterator["pa.RecordBatch"]) -> WriterCommitMessage:
        return job_write.write_partition(self.opts, self.job_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        job_write.commit(self.opts, self.job_id, job_write.task_messages(messages),
                         self.overwrite)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        job_write.abort(self.opts, self.job_id)
