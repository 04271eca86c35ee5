"""A streaming pipeline over pybk logs with Spark: tail a live log and copy a transform
of every record into another log, exactly once, through a restart.

    pybk localcluster 3                    # in another terminal: prints zk://...
    python examples/spark_streaming.py [--seconds 10] zk://127.0.0.1:PORT/ledgers

Without an address it runs on a throwaway cluster of its own.  A thread of the
application appends to the log ``example-clicks-<run>`` while a streaming query reads it
(at most 1000 records per micro-batch) and writes each record upper-cased to
``example-clicks-upper-<run>`` (``<run>``: a random name of this run's own, so that runs
on one cluster never mix).  The query is stopped halfway (once it has committed a
micro-batch, while the next one writes) and started again from its checkpoint, as after
a crash; at the end a last run with ``Trigger.AvailableNow`` catches up, and the example
checks that the copy holds every record of the source exactly once, in order.  The sink
records each committed micro-batch in the log's metadata under its ``sinkId``, so a
micro-batch that Spark replays after a restart commits nothing twice.

Then an event-time query counts the clicks per second of their ``timestamp`` (each
record's append time, kept by the log) in windows that a watermark closes, and writes
each closed window to ``example-clicks-per-second-<run>`` as a record with a key (the
window's start), a timestamp (its end) and a JSON value; the example checks every count
against the source's records.  In append mode a window is written once the watermark
(the latest click seen, less a second) has passed its end, so the last second or two of
clicks stay in windows still open when the query stops.

Stopping a query interrupts the micro-batch in flight, as a crash would: Spark
cancels its job and aborts its write (the sink deletes the ledgers its tasks wrote; the
restarted query writes that micro-batch again), and logs it at ERROR although nothing
failed: ``WriteToDataSourceV2Exec: Data source write support MicroBatchWrite[...] is
aborting`` and ``aborted`` on the driver, ``Utils: Aborting task`` (with the task's
stack) and ``DataWritingSparkTask: Aborting commit for partition`` in the task.  The
example sets those three loggers to FATAL (:func:`quiet_stop_aborts`), so a successful
run prints no ERROR; a query that fails still fails the example, with Spark's error.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import uuid
from typing import NamedTuple

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import pybk
import pybk.spark
from pybk.testing.local_cluster import LocalCluster

#: Spark's loggers of a micro-batch write aborted because its query was stopped (module
#: docstring): the driver's, and its tasks'.
STOP_ABORT_LOGGERS = ("org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec",
                      "org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask",
                      "org.apache.spark.util.Utils")


class Logs(NamedTuple):
    """This run's logs: the live source, its upper-cased copy and its counts per
    second."""

    source: str
    sink: str
    per_second: str

    @classmethod
    def of_a_new_run(cls) -> "Logs":
        run = uuid.uuid4().hex[:8]
        return cls(f"example-clicks-{run}", f"example-clicks-upper-{run}",
                   f"example-clicks-per-second-{run}")


def appender(address: str, logs: Logs, stop: threading.Event) -> threading.Thread:
    """The application: appends a record every 5 ms or so until told to stop."""
    def run() -> None:
        with pybk.connect(address) as bk, pybk.LogWriter.open(bk, logs.source) as w:
            i = 0
            while not stop.is_set():
                w.append_async(b"click %06d" % i)
                i += 1
                time.sleep(0.005)
    thread = threading.Thread(target=run, name="appender")
    thread.start()
    return thread


def start_query(spark: SparkSession, address: str, logs: Logs, checkpoint: str,
                **trigger: object) -> StreamingQuery:
    clicks = (spark.readStream.format("pybk").option("metadataServiceUri", address)
              .option("log", logs.source).option("startingPosition", "earliest")
              .option("maxRecordsPerTrigger", 1000).load())
    return (clicks.select(F.upper(F.col("value").cast("string")).alias("value"))
            .writeStream.format("pybk").option("metadataServiceUri", address)
            .option("log", logs.sink).option("sinkId", "clicks-to-upper")
            .option("checkpointLocation", checkpoint).trigger(**trigger).start())


def count_per_second(spark: SparkSession, address: str, logs: Logs, checkpoint: str) -> None:
    """The clicks of each second of event time, once the watermark closed it, written
    as records keyed by the window's start, timestamped with its end."""
    with pybk.connect(address) as bk:
        clicks_appended = sum(1 for _ in pybk.LogReader(bk, logs.source).read())
    # In four micro-batches: the watermark each one moves closes windows in the next.
    clicks = (spark.readStream.format("pybk").option("metadataServiceUri", address)
              .option("log", logs.source).option("startingPosition", "earliest")
              .option("maxRecordsPerTrigger", clicks_appended // 4 + 1).load())
    counts = (clicks.withWatermark("timestamp", "1 second")
              .groupBy(F.window("timestamp", "1 second")).count())
    (counts.select(F.col("window.start").cast("string").alias("key"),
                   F.col("window.end").alias("timestamp"),
                   F.to_json(F.struct(F.col("window.start").alias("start"),
                                      "count")).alias("value"))
     .writeStream.format("pybk").option("metadataServiceUri", address)
     .option("log", logs.per_second).option("sinkId", "clicks-per-second")
     .option("checkpointLocation", checkpoint).outputMode("append")
     .trigger(availableNow=True).start().awaitTermination())


def check_counts(address: str, logs: Logs) -> None:
    with pybk.connect(address) as bk:
        source = [r.timestamp for r in pybk.LogReader(bk, logs.source).records()]
        windows = list(pybk.LogReader(bk, logs.per_second).records())
    assert windows, "the watermark closed no window"
    for window in windows:
        assert window.timestamp is not None
        start = window.timestamp - 1000
        expected = sum(1 for t in source if t is not None and start <= t < window.timestamp)
        assert json.loads(window.value)["count"] == expected, window
    counted = sum(json.loads(window.value)["count"] for window in windows)
    print(f"{len(windows)} windows of a second closed by the watermark hold {counted} of "
          f"the {len(source)} clicks, each window's count checked against the source")


def run_until_mid_batch(spark: SparkSession, query: StreamingQuery, seconds: float,
                        timeout: float = 180.0) -> int:
    """Let ``query`` run for ``seconds``, and on until it has committed a micro-batch
    that read records (so that a restart has a checkpoint to resume from) and the write
    of a micro-batch is running (so that stopping the query interrupts it, as a crash
    would), at most ``timeout``; returns how many micro-batches that read records it
    committed.  Raises the query's error if it fails meanwhile."""
    deadline = time.monotonic() + seconds
    give_up = time.monotonic() + timeout
    jobs = spark.sparkContext.statusTracker()
    while True:
        if not query.isActive:
            raise query.exception() or RuntimeError("the query stopped by itself")
        committed = sum(1 for p in query.recentProgress if p["numInputRows"] > 0)
        now = time.monotonic()
        # The query's only Spark job is a micro-batch's read and write.
        if (committed and now >= deadline and jobs.getActiveJobsIds()) or now >= give_up:
            return committed
        time.sleep(0.05)


def quiet_stop_aborts(spark: SparkSession) -> None:
    """Spark's loggers of stopped micro-batches to FATAL (module docstring), through
    log4j, which PySpark reaches only by its JVM gateway."""
    jvm = spark.sparkContext._jvm
    for name in STOP_ABORT_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            name, jvm.org.apache.logging.log4j.Level.FATAL)


def check(address: str, logs: Logs) -> None:
    with pybk.connect(address) as bk:
        source = [data for _, data in pybk.LogReader(bk, logs.source).read()]
        sink = [data for _, data in pybk.LogReader(bk, logs.sink).read()]
    assert sink == [data.upper() for data in source], "the copy differs from the source"
    print(f"{logs.sink!r} holds all {len(source)} records of {logs.source!r} upper-cased, "
          "exactly once and in order")


def main(address: str, seconds: float) -> None:
    logs = Logs.of_a_new_run()
    print(f"copying {logs.source!r} to {logs.sink!r}")
    spark = (SparkSession.builder.master("local[2]").appName("pybk-streaming")
             .config("spark.sql.shuffle.partitions", 2)  # the counts' state: small
             .getOrCreate())
    quiet_stop_aborts(spark)
    stop = threading.Event()
    thread = appender(address, logs, stop)
    try:
        pybk.spark.register(spark)
        with tempfile.TemporaryDirectory() as checkpoint:
            for run in (1, 2):  # the second run resumes from the first's checkpoint
                query = start_query(spark, address, logs, checkpoint,
                                    processingTime="1 second")
                committed = run_until_mid_batch(spark, query, seconds / 2)
                query.stop()  # aborts the micro-batch in flight
                print(f"run {run}: stopped the query after {committed} micro-batches, "
                      "aborting the one in flight")
            stop.set()
            thread.join()
            start_query(spark, address, logs, checkpoint,
                        availableNow=True).awaitTermination()
        with tempfile.TemporaryDirectory() as checkpoint:
            count_per_second(spark, address, logs, checkpoint)
    finally:
        stop.set()
        thread.join()
        spark.stop()
    check(address, logs)
    check_counts(address, logs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("address", nargs="?", help="zk://host:port/ledgers (default: a "
                        "cluster of its own)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long the live query runs, over its two runs")
    args = parser.parse_args()
    if args.address:
        main(args.address, args.seconds)
    else:
        with LocalCluster() as cluster:
            main(cluster.address, args.seconds)
