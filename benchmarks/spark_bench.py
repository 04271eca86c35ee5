#!/usr/bin/env python3
"""Benchmark: Spark reading and writing a pybk log, beside Spark reading and writing the
same records as Parquet, in one run.

Usage::

    python benchmarks/spark_bench.py [--quick] [--dir DIR] [--records N]

A throwaway cluster (:class:`pybk.testing.local_cluster.LocalCluster`: ZooKeeper and three
bookie processes on loopback) and a local SparkSession (``local[2]``) on this machine.
The records are 1 KiB binary values made by Spark from ``spark.range`` (32 SHA-256
digests of the id: incompressible, so that Parquet's compression finds nothing to
squeeze, as in real data) and cached, so that both writes start from the same rows in
memory.  In order:

* ``write.parquet``: the rows written to a Parquet directory;
* ``write.pybk``: the same rows written to a new log (``df.write.format("pybk")``, one
  commit for the job), with the log's default replication on a cluster (E=3, Qw=2,
  Qa=2) unless ``--copies 1``;
* ``read.parquet`` / ``read.pybk``: each read back whole and aggregated (``count`` and
  the sum of the values' lengths, so that every value is read: a Parquet ``count()``
  alone reads only the footers).

Every phase runs twice and the second run is the one timed (the first writes to a
throwaway log or directory): the first run of a code path in a fresh SparkSession pays
for the JVM's compilation of it and for starting Python workers (a cold read of a log
took 77,000 records/s where warm ones took 213,000-230,000), which Parquet's path, all
JVM, pays on its own first run too.

Each phase reports seconds, records/s and MB/s (MiB of values), and the CPU it used
(``cpu``: seconds of CPU of the bookie processes, and of everything else this process
started, which is Spark: its JVM and Python workers; with microseconds per record), which
shows what bounds a rate on a machine whose cores they all share.  ``ratios`` divides
pybk's rates by Parquet's.  The targets (the issue's): reading at least 0.5 of Parquet's
rate, writing at least 0.3.  ``--quick`` moves 256 MiB (under two minutes); the full run
1 GiB.  Progress goes to stderr; stdout gets one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pybk.testing.local_cluster import LocalCluster  # noqa: E402

RECORD_BYTES = 1024
MIB = 1 << 20
READ_TARGET, WRITE_TARGET = 0.5, 0.3


def say(message: str) -> None:
    print(f"[spark_bench] {message}", file=sys.stderr, flush=True)


def spark_session(workdir: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import pybk.spark
    spark = (SparkSession.builder.master("local[2]").appName("pybk-spark-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "4g")
             .config("spark.local.dir", os.path.join(workdir, "spark"))
             .config("spark.sql.shuffle.partitions", "4")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    pybk.spark.register(spark)
    return spark


def descendants_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system, with reaped children's) of every live descendant of
    this process, by pid (from /proc)."""
    parents, used = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                fields = f.read().rpartition(")")[2].split()  # from the 3rd (state) on
        except OSError:
            continue  # gone meanwhile
        parents[int(entry)] = int(fields[1])
        used[int(entry)] = sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - mine
        mine |= frontier
    return {pid: used[pid] for pid in mine}


def cpu_split(before: dict[int, float], after: dict[int, float], bookies: set[int],
              records: int) -> dict:
    """CPU used between two samples by the bookies and by the rest (Spark)."""
    def spent(pids) -> float:
        return sum(after[pid] - before.get(pid, 0.0) for pid in pids)
    bookie_s = spent(p for p in after if p in bookies)
    spark_s = spent(p for p in after if p not in bookies)
    return {"bookies_s": round(bookie_s, 2), "spark_s": round(spark_s, 2),
            "bookies_us_per_record": round(bookie_s * 1e6 / records, 1),
            "spark_us_per_record": round(spark_s * 1e6 / records, 1)}


def timed(name: str, records: int, action, bookies: set[int] = frozenset()) -> dict:
    """Run ``action(True)`` once to warm up, then time ``action(False)``."""
    say(f"{name}: warming up ...")
    action(True)
    say(f"{name} ...")
    cpu_before = descendants_cpu_s()
    start = time.perf_counter()
    result = action(False)
    seconds = time.perf_counter() - start
    cpu = cpu_split(cpu_before, descendants_cpu_s(), bookies, records)
    figures = {"seconds": round(seconds, 2), "records_per_s": round(records / seconds),
               "mb_per_s": round(records * RECORD_BYTES / MIB / seconds, 1), "cpu": cpu}
    say(f"{name}: {figures}")
    return {**figures, "result": result}


def aggregate(df) -> tuple[int, int]:
    row = df.selectExpr("count(*) AS n", "sum(length(value)) AS bytes").collect()[0]
    return row["n"], row["bytes"]


def run(args: argparse.Namespace, workdir: str) -> dict:
    records = args.records or (256 if args.quick else 1024) * MIB // RECORD_BYTES
    partitions = args.partitions
    cluster = LocalCluster(bookies=3, directory=os.path.join(workdir, "cluster")).start()
    spark = None
    try:
        spark = spark_session(workdir)
        # 1 KiB values: the SHA-256 digests of "id:0" to "id:31", joined.
        rows = (spark.range(0, records, numPartitions=partitions)
                .selectExpr("unhex(concat_ws('', transform(sequence(0, 31), "
                            "i -> sha2(concat(id, ':', i), 256)))) AS value")
                .cache())
        assert rows.count() == records
        copies = {"ensembleSize": "3", "writeQuorumSize": "2", "ackQuorumSize": "2"} \
            if args.copies == 2 else {"ensembleSize": "1", "writeQuorumSize": "1",
                                      "ackQuorumSize": "1"}
        pybk_options = {"metadataServiceUri": cluster.address, "log": "bench", **copies}
        parquet = os.path.join(workdir, "parquet")
        bookies = {process.pid for process in cluster.processes}
        phases = {
            "write.parquet": timed("write.parquet", records, lambda warm_up: rows.write
                                   .mode("overwrite").parquet(parquet + "-warm" * warm_up)),
            "write.pybk": timed("write.pybk", records, lambda warm_up: rows.write
                                .format("pybk").options(**pybk_options)
                                .option("log", "warm-up" if warm_up else "bench")
                                .mode("append").save(), bookies),
        }
        expected = (records, records * RECORD_BYTES)
        reader_options = {"metadataServiceUri": cluster.address, "log": "bench"}
        phases["read.parquet"] = timed("read.parquet", records,
                                       lambda _: aggregate(spark.read.parquet(parquet)))
        phases["read.pybk"] = timed("read.pybk", records, lambda _: aggregate(
            spark.read.format("pybk").options(**reader_options).load()), bookies)
        for name in ("read.parquet", "read.pybk"):
            got = tuple(phases[name].pop("result"))
            if got != expected:
                raise SystemExit(f"{name} read {got} (records, bytes), expected {expected}")
        for name in ("write.parquet", "write.pybk"):
            phases[name].pop("result")
        ratios = {
            "read": round(phases["read.pybk"]["records_per_s"]
                          / phases["read.parquet"]["records_per_s"], 2),
            "write": round(phases["write.pybk"]["records_per_s"]
                           / phases["write.parquet"]["records_per_s"], 2),
        }
        return {"records": records, "record_bytes": RECORD_BYTES, "partitions": partitions,
                "copies": args.copies, "phases": phases, "ratios": ratios,
                "targets": {"read": READ_TARGET, "write": WRITE_TARGET,
                            "read_met": ratios["read"] >= READ_TARGET,
                            "write_met": ratios["write"] >= WRITE_TARGET}}
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB instead of 1 GiB")
    parser.add_argument("--records", type=int, help="how many 1 KiB records")
    parser.add_argument("--partitions", type=int, default=8, help="Spark partitions")
    parser.add_argument("--copies", type=int, choices=(1, 2), default=2,
                        help="2: E=3, Qw=2, Qa=2 (the default of a log); 1: one copy")
    parser.add_argument("--dir", default=".", help="where the temporary directory goes")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="pybk-spark-bench-", dir=args.dir)
    try:
        print(json.dumps(run(args, workdir)), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
