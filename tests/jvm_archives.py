"""Class-data archives for the tests' JVMs: each ZooKeeper server and each Spark JVM of
the suite maps the classes it loads from an archive made once, instead of reading,
verifying and linking them from the jars at every start.

A JVM spends most of its start loading classes (Spark's driver loads about 10,000); a
test run starts dozens of them (a ZooKeeper server per worker and per test that restarts
one, a Spark application per README block and example, the executors of a
``local-cluster``).  Java's dynamic class-data sharing (JDK 13+) records the classes a
JVM loaded into a file at its exit (``-XX:ArchiveClassesAtExit``); a later JVM with the
same class path maps it (``-XX:SharedArchiveFile``).  Measured on a 2-core machine: a
ZooKeeper server's start from about 2.9 to 1.7 s of CPU, a one-row Spark write from
about 24 to 16 s.  What the JVMs run is the same; only where their classes come from
changes.

``make test`` runs this module first (``python tests/jvm_archives.py``): it makes the
archives that are missing, each in a JVM of its own that does a small version of the
work (a ZooKeeper server that starts and stops; a Spark session that writes and reads a
pybk WAL), into :data:`ARCHIVE_DIR` (beside the interpreter's environment, whose jars
they describe).  :func:`options` gives the options that use an archive, or none while it
is missing: the JVMs then start as before.  An archive that no longer matches (Java or
the jars changed) is not used and says nothing (its warnings are off); ``make clean``
removes it with the environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: Where the archives live: in the environment whose jars (pyspark's, ZooKeeper's) they
#: were made from.
ARCHIVE_DIR = Path(sys.prefix) / "jvm-archives"
#: The JVMs that get an archive.
KINDS = ("zookeeper", "spark")
#: A JVM that cannot use an archive (another Java, changed jars) says so on stdout,
#: which a test may read: these keep it quiet.
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def archive(kind: str) -> Path:
    return ARCHIVE_DIR / f"{kind}.jsa"


#: Set (to a path) in the process that makes an archive: its JVMs record their classes
#: there instead of mapping an archive.
DUMP_VARIABLE = "PYBK_TEST_JVM_ARCHIVE_DUMP"


def options(kind: str) -> list[str]:
    """The JVM options that map ``kind``'s archive; none while it is not made (naming a
    missing archive would turn off the JDK's own class sharing too)."""
    dump = os.environ.get(DUMP_VARIABLE)
    if dump:
        return [f"-XX:ArchiveClassesAtExit={dump}", *QUIET]
    path = archive(kind)
    return [f"-XX:SharedArchiveFile={path}", *QUIET] if path.exists() else []


def _make(kind: str) -> None:
    """Make ``kind``'s archive: a JVM does the small version of its work and records its
    classes at exit into a file of its own, which then takes the archive's name (so a
    JVM starting meanwhile never maps half a file)."""
    ARCHIVE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ARCHIVE_DIR) as scratch:
        made = Path(scratch) / f"{kind}.jsa"
        work = subprocess.run([sys.executable, __file__, f"--{kind}-work", scratch],
                              timeout=600, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, env=dict(os.environ, **{DUMP_VARIABLE: str(made)}))
        if work.returncode != 0:  # what it printed, only when it failed (Spark's is long)
            raise SystemExit(f"jvm_archives: making the {kind} archive failed:\n"
                             f"{work.stdout}{work.stderr[-5000:]}")
        if made.exists():  # a JVM that could not dump (another Java) left none
            os.replace(made, archive(kind))


def _zookeeper_work(_scratch: str) -> None:
    """A ZooKeeper server that starts, serves a client and stops (given the time its
    JVM needs to write the archive as it exits)."""
    from zkutil import server
    zookeeper = server()
    zookeeper.stop_grace_s = 300.0
    with zookeeper:
        from kazoo.client import KazooClient
        client = KazooClient(hosts=zookeeper.connect_string)
        client.start(timeout=30)
        try:
            client.ensure_path("/archive/work")
        finally:
            client.stop()
            client.close()


def _spark_work(scratch: str) -> None:
    """A Spark session that writes and reads a pybk WAL, as a test does; its JVM records
    its classes at exit (after :func:`_stop_jvm`)."""
    import sparkutil
    with sparkutil.spark_session(**{"spark.local.dir": scratch}) as spark:
        wal = os.path.join(scratch, "wal")
        frame = spark.createDataFrame([("k", b"v", 1_767_225_600_000)],
                                      "key string, value binary, timestamp long")
        frame.write.format("pybk").mode("append").save(wal)
        assert spark.read.format("pybk").load(wal).count() == 1
        query = (spark.readStream.format("pybk").load(wal).writeStream.format("memory")
                 .queryName("archive").option("checkpointLocation",
                                                   os.path.join(scratch, "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(300)
    _stop_jvm()


def _stop_jvm() -> None:
    """End the session's JVM and wait for it: it writes the archive as it exits, and it
    exits when its standard input closes (PySpark's gateway watches it)."""
    from pyspark import SparkContext
    gateway = SparkContext._gateway
    process = getattr(gateway, "proc", None)
    if process is None:
        return
    process.stdin.close()
    process.wait(timeout=300)


#: The small version of each kind's work, run in a process of its own.
WORK = {"--zookeeper-work": _zookeeper_work, "--spark-work": _spark_work}


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] in WORK:
        WORK[sys.argv[1]](sys.argv[2])
        return 0
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        print("jvm_archives: no Java runtime; the tests' JVMs start without archives")
        return 0
    for kind in KINDS:
        if not archive(kind).exists():
            print(f"jvm_archives: making the {kind} JVMs' class archive in {ARCHIVE_DIR}")
            _make(kind)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
