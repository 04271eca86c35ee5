"""An ETL job over pybk logs with Spark: read a log of JSON events, count them per user,
and write the counts to another log, exactly once.

    pybk localcluster 3                    # in another terminal: prints zk://...
    python examples/spark_batch.py zk://127.0.0.1:PORT/ledgers

Without an address it runs on a throwaway cluster of its own (ZooKeeper and three bookie
processes).  The application side first appends 10,000 events to the log
``example-etl-events`` with a LogWriter (if the log is empty); then Spark reads the log
into a DataFrame, parses and aggregates it, and writes one JSON record per user to
``example-etl-user-counts``: the job's tasks write ledgers of their own, and the records
become visible all at once, when the job commits.  Running it again adds the same counts
again: each run is one job.  The logs' names are this example's own, so that it never
reads what another program wrote; a record that is not such an event stops it before it
writes anything (exit status 1, naming the record's position).
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import pybk
import pybk.spark
from pybk.errors import NoSuchLog
from pybk.testing.local_cluster import LocalCluster

EVENTS, COUNTS = "example-etl-events", "example-etl-user-counts"
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
    parsed = events.select("position", F.from_json(F.col("value").cast("string"),
                                                   "user string, n long").alias("event"))
    parsed.cache()  # read the log once for the check, the counts and the total
    # from_json gives null (or a null user) for a record that is not such an event:
    # counting those as a user "null" would hide it, so the job stops instead.
    bad = parsed.where(F.col("event.user").isNull()).limit(3).collect()
    if bad:
        raise SystemExit(f"the log {EVENTS!r} holds records that are not JSON events with "
                         f"a user, at {', '.join(row.position for row in bad)}: this example"
                         " reads only what its append_events wrote; nothing was written")
    counts = parsed.groupBy("event.user").count()
    (counts.select(F.to_json(F.struct("user", "count")).alias("value"))
     .write.format("pybk").option("metadataServiceUri", address).option("log", COUNTS)
     .mode("append").save())
    print(f"read {parsed.count()} events; wrote {counts.count()} counts to {COUNTS!r}")


def show_counts(address: str) -> None:
    with pybk.connect(address) as bk:
        for position, data in pybk.LogReader(bk, COUNTS).read():
            print(f"  {position}: {data.decode()}")


def main(address: str) -> None:
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
