"""An ETL job over pybk logs with Spark: read a log of JSON events, count them per user,
and write the counts to another log, exactly once.

    pybk localcluster                      # in another terminal: prints zk://...
    python examples/spark_batch.py zk://127.0.0.1:PORT/ledgers

Without an address it runs on a throwaway cluster of its own (ZooKeeper and three bookie
processes).  The application side first appends 10,000 events to the log ``events``
with a LogWriter (if the log is empty); then Spark reads the log into a DataFrame, parses
and aggregates it, and writes one JSON record per user to ``user-counts``: the job's
tasks write ledgers of their own, and the records become visible all at once, when the
job commits.  Running it again adds the same counts again: each run is one job.
"""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import pybk
import pybk.spark
from pybk.errors import NoSuchLog
from pybk.testing.local_cluster import LocalCluster

EVENTS, COUNTS = "events", "user-counts"
USERS = ("ada", "brian", "carol", "dennis", "edsger")


def append_events(address: str, count: int = 10_000) -> None:
    """The application side: append JSON events to the log unless it holds some."""
    with pybk.connect(address) as bk:
        try:
            if next(pybk.LogReader(bk, EVENTS).read(), None) is not None:
                return
        except NoSuchLog:
            pass  # a new log: the writer creates it
        with pybk.LogWriter.open(bk, EVENTS) as writer:
            futures = [writer.append_async(json.dumps(
                {"user": USERS[i % len(USERS)], "n": i}).encode()) for i in range(count)]
            for future in futures:
                future.result()
    print(f"appended {count} events to the log {EVENTS!r}")


def run_job(spark: SparkSession, address: str) -> None:
    events = (spark.read.format("pybk")
              .option("metadataServiceUri", address).option("log", EVENTS).load())
    counts = (events
              .select(F.from_json(F.col("value").cast("string"),
                                  "user string, n long").alias("event"))
              .groupBy("event.user").count())
    (counts.select(F.to_json(F.struct("user", "count")).alias("value"))
     .write.format("pybk").option("metadataServiceUri", address).option("log", COUNTS)
     .mode("append").save())
    print(f"read {events.count()} events; wrote {counts.count()} counts to {COUNTS!r}")


def show_counts(address: str) -> None:
    with pybk.connect(address) as bk:
        for position, data in pybk.LogReader(bk, COUNTS).read():
            print(f"  {position}: {data.decode()}")


def main(address: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    append_events(address)
    spark = SparkSession.builder.master("local[2]").appName("pybk-etl").getOrCreate()
    try:
        pybk.spark.register(spark)
        run_job(spark, address)
    finally:
        spark.stop()
    show_counts(address)


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit("usage: python examples/spark_batch.py [zk://host:port/ledgers]")
    if len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        with LocalCluster() as cluster:
            main(cluster.address)
