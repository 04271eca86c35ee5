"""A streaming pipeline over pybk logs with Spark: tail a live log and copy a transform
of every record into another log, exactly once, through a restart.

    pybk localcluster                      # in another terminal: prints zk://...
    python examples/spark_streaming.py [--seconds 10] zk://127.0.0.1:PORT/ledgers

Without an address it runs on a throwaway cluster of its own.  A thread of the
application appends to the log ``clicks`` while a streaming query reads it (at most 1000
records per micro-batch) and writes each record upper-cased to ``clicks-upper``.  The
query is stopped halfway (once it has committed a micro-batch) and started again from its
checkpoint, as after a crash; at the end a last run with ``Trigger.AvailableNow`` catches
up, and the example checks that ``clicks-upper`` holds every record of ``clicks`` exactly
once, in order.  The sink records each committed micro-batch in the log's metadata under
its ``sinkId``, so a micro-batch that Spark replays after a restart commits nothing twice.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import pybk
import pybk.spark
from pybk.testing.local_cluster import LocalCluster

SOURCE, SINK = "clicks", "clicks-upper"


def appender(address: str, stop: threading.Event) -> threading.Thread:
    """The application: appends a record every 5 ms or so until told to stop."""
    def run() -> None:
        with pybk.connect(address) as bk, pybk.LogWriter.open(bk, SOURCE) as w:
            i = 0
            while not stop.is_set():
                w.append_async(b"click %06d" % i)
                i += 1
                time.sleep(0.005)
    thread = threading.Thread(target=run, name="appender")
    thread.start()
    return thread


def start_query(spark: SparkSession, address: str, checkpoint: str, **trigger: object):
    clicks = (spark.readStream.format("pybk").option("metadataServiceUri", address)
              .option("log", SOURCE).option("startingPosition", "earliest")
              .option("maxRecordsPerTrigger", 1000).load())
    return (clicks.select(F.upper(F.col("value").cast("string")).alias("value"))
            .writeStream.format("pybk").option("metadataServiceUri", address)
            .option("log", SINK).option("sinkId", "clicks-to-upper")
            .option("checkpointLocation", checkpoint).trigger(**trigger).start())


def run_for(query: StreamingQuery, seconds: float, first_batch_timeout: float = 180.0) -> int:
    """Let ``query`` run for ``seconds``, and on until it has committed a micro-batch
    that read records (so that a restart has a checkpoint to resume from), at most
    ``first_batch_timeout``; returns how many such micro-batches it committed."""
    deadline = time.monotonic() + seconds
    give_up = time.monotonic() + first_batch_timeout
    while True:
        committed = sum(1 for p in query.recentProgress if p["numInputRows"] > 0)
        now = time.monotonic()
        if (committed and now >= deadline) or now >= give_up:
            return committed
        time.sleep(0.2)


def check(address: str) -> None:
    with pybk.connect(address) as bk:
        source = [data for _, data in pybk.LogReader(bk, SOURCE).read()]
        sink = [data for _, data in pybk.LogReader(bk, SINK).read()]
    assert sink == [data.upper() for data in source], "the copy differs from the source"
    print(f"{SINK!r} holds all {len(source)} records of {SOURCE!r} upper-cased, exactly "
          "once and in order")


def main(address: str, seconds: float) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.master("local[2]").appName("pybk-streaming").getOrCreate()
    stop = threading.Event()
    thread = appender(address, stop)
    try:
        pybk.spark.register(spark)
        with tempfile.TemporaryDirectory() as checkpoint:
            for run in (1, 2):  # the second run resumes from the first's checkpoint
                query = start_query(spark, address, checkpoint, processingTime="1 second")
                committed = run_for(query, seconds / 2)
                query.stop()
                print(f"run {run}: stopped the query after {committed} micro-batches")
            stop.set()
            thread.join()
            start_query(spark, address, checkpoint, availableNow=True).awaitTermination()
    finally:
        stop.set()
        thread.join()
        spark.stop()
    check(address)


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
