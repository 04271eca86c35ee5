"""``df.writeStream.format("pybk")``: each micro-batch committed to the log exactly once.

Each micro-batch is a job of its own (:mod:`pybk.spark.job_write`), committed with the
query's ``sinkId`` and the micro-batch's id in the same compare-and-set
(:mod:`pybk.log.commit`): a micro-batch that Spark replays after a restart (its id
recorded already) commits nothing and its ledgers are deleted.  ``sinkId`` is required
and chosen by the user: a key derived from the checkpoint would restart at batch 0 with
a deleted checkpoint and silently skip data.  A query restarted from a deleted or reset
checkpoint under the same ``sinkId`` fails at its first commit (its batch id is older
than the one recorded), naming the way out: a new ``sinkId``.  In complete output mode
(``overwrite``) each micro-batch replaces the log's records.  A micro-batch without rows
commits nothing (its id is not recorded: replayed, it adds nothing either).

Spark builds a writer where it plans each micro-batch (its job is begun there and its id
pickled to the tasks), and another one for the commit, in another process: the commit
takes the job id from the tasks' messages, and deletes the empty job its own writer
began.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Sequence

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pybk.errors import InvalidConfiguration
from pybk.log.commit import Sink
from pybk.spark import job_write
from pybk.spark.options import PybkOptions

if TYPE_CHECKING:
    import pyarrow as pa


class StreamWriter(DataSourceStreamArrowWriter):
    """The sink of one streaming query on one log (see the module docstring)."""

    def __init__(self, opts: PybkOptions, schema: StructType, overwrite: bool) -> None:
        if opts.get("sinkId") is None:
            raise InvalidConfiguration(
                "option sinkId is required for a streaming write: a name for this query's "
                "sink, kept with the log, under which each committed micro-batch's id is "
                "recorded so that a replayed micro-batch commits nothing twice (keep it "
                "across restarts of the query)")
        self.opts = opts
        self.overwrite = overwrite
        self.job_id = job_write.begin(opts)

    def write(self, iterator: Iterator["pa.RecordBatch"]) -> WriterCommitMessage:
        return job_write.write_partition(self.opts, self.job_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        ours = job_write.task_messages(messages)
        job_id = self._tasks_job(ours)
        if job_id is not None:
            job_write.commit(self.opts, job_id, ours, self.overwrite,
                             Sink(self.opts.get("sinkId"), batchId))
        if self.job_id != job_id:
            job_write.settle(self.opts, self.job_id)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        job_id = self._tasks_job(job_write.task_messages(messages))
        if job_id is not None:
            job_write.abort(self.opts, job_id)
        if self.job_id != job_id:
            job_write.settle(self.opts, self.job_id)

    def _tasks_job(self, messages: Sequence[job_write.PybkCommitMessage | None]
                   ) -> str | None:
        """The job the micro-batch's tasks wrote for (None without a message: a job
        without tasks, which orphan cleaning deletes)."""
        found = {m.job_id for m in messages if m is not None}
        if len(found) > 1:
            raise InvalidConfiguration(f"{self.opts.describe()}: one micro-batch's tasks "
                                       f"wrote for several jobs: {sorted(found)}")
        return found.pop() if found else None
