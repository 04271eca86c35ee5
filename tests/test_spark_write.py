"""Writing pybk logs from Spark, exactly once: ``df.write.format("pybk")`` and
``df.writeStream.format("pybk")`` (pybk.spark.batch_write, stream_write, job_write).

Real Spark in local mode (the worker's SparkSession, local[2] with up to 3
attempts a task), a real ZooKeeper and three bookie processes; each test writes a log
of its own and reads it back with a LogReader.  A driver killed with SIGKILL runs as a
child process with a SparkSession of its own (tests/spark_write_child.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import zkutil
from clusterutil import TESTS, child_env
from securityutil import secured_cluster_of_bookies

from pybk.log import LogReader, jobs
from pybk.log.batch import LOG_NAME_KEY, keeps_running_maxima
from pybk.log.metadata import jobs_path, read_log
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(300)

#: Each task may be tried 3 times (the retry tests fail a first attempt on purpose).
MASTER = "local[2,3]"


@pytest.fixture(scope="module")
def spark_conf():
    """The worker's SparkSession with task retries (tests/conftest.py)."""
    return {"master": MASTER}


@pytest.fixture
def log_name():
    return f"log-{uuid.uuid4().hex[:8]}"


def writer(df, address, log_name, **options):
    return (df.write.format("pybk").option("metadataServiceUri", address)
            .option("log", log_name).options(**options))


def records(bk, log_name) -> list[bytes]:
    return [value for _position, value in LogReader(bk, log_name).read()]


def ledgers_of(bk, log_name) -> set[int]:
    """Every ledger written for the log (its segments' and its jobs' alike)."""
    tag = log_name.encode()
    found = set()
    for ledger_id in bk.list_ledgers():
        try:
            metadata = bk.ledger_manager.read(ledger_id).metadata
        except Exception:  # deleted meanwhile (another test's)
            continue
        if metadata.custom_metadata.get(LOG_NAME_KEY) == tag:
            found.add(ledger_id)
    return found


def segment_ledgers(bk, log_name) -> set[int]:
    from pybk.log.metadata import live_segments
    head = read_log(bk.metadata, log_name).metadata
    return {s.ledger_id for s in live_segments(bk.metadata, head)}


def pending_jobs(bk, log_name) -> list[str]:
    """The log's jobs not settled: every record under its jobs but the committed markers
    (which batch jobs keep for a day, so that an abort after a lost answer tells)."""
    path = jobs_path(log_name)
    names = bk.metadata.children(path) if bk.metadata.exists(path) else []
    return [n for n in names if jobs.is_pending(jobs.read_job(bk.metadata, log_name, n))]


def numbered(spark, count: int, partitions: int):
    """Rows ``r000000``, ``r000001``... as binary values, in ``partitions`` partitions
    of consecutive numbers."""
    return spark.range(count, numPartitions=partitions).selectExpr(
        "cast(format_string('r%06d', id) as binary) as value")


def expected(count: int) -> list[bytes]:
    return [b"r%06d" % i for i in range(count)]


# -- batch writes ------------------------------------------------------------------------


def test_a_dataframe_of_8_partitions_is_written_and_read_back_in_partition_order(
        spark, address, bk, log_name):
    """100,000 records in 8 partitions, in segments of 64 KiB (so every task rolls to
    new ledgers): the log holds them all once, partition after partition; the job leaves
    no ledger and no record behind."""
    writer(numbered(spark, 100_000, 8), address, log_name,
           segmentMaxBytes=str(64 * 1024)).mode("append").save()
    assert records(bk, log_name) == expected(100_000)
    segments = segment_ledgers(bk, log_name)
    assert len(segments) > 8
    assert ledgers_of(bk, log_name) == segments
    # Tagged as keeping running maxima: a commit (before they are segments: no
    # max_before) trusts their last headers.
    assert all(keeps_running_maxima(bk.ledger_manager.read(i).metadata.custom_metadata,
                                    None) for i in segments)
    assert pending_jobs(bk, log_name) == []
    # A second job appends after the first; string values are written as UTF-8.
    writer(spark.createDataFrame([("héllo",), ("wörld",)], "value string"), address,
           log_name).mode("append").save()
    assert records(bk, log_name)[-3:] == [b"r099999", "héllo".encode(), "wörld".encode()]


@pytest.fixture
def small_arrow_batches(spark):
    """Rows reach the writer 100 at a time, so that a task's first rows are written
    while a later row is still being computed."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "100")
    yield
    spark.conf.set(key, before)


def faulty_pybk(spark, name: str, fault) -> str:
    """Register a ``pybk`` data source named ``name`` whose tasks see their rows through
    ``fault(iterator)``; return the name.  (Classes made in a function are pickled by
    value, so Spark's workers need no test module.)"""
    from pybk.spark.batch_write import BatchWriter
    from pybk.spark.options import WRITE, parse
    from pybk.spark.source import PybkDataSource

    class FaultyWriter(BatchWriter):
        def write(self, iterator):
            return BatchWriter.write(self, fault(iterator))

    class FaultySource(PybkDataSource):
        @classmethod
        def name(cls):
            return name

        def writer(self, schema, overwrite):
            return FaultyWriter(parse(self.options, WRITE), schema, overwrite)

    spark.dataSource.register(FaultySource)
    return name


def _dies_after_its_first_batch(address: str, log_name: str, marker: str, attempts):
    """A fault: partition 1's attempts numbered in ``attempts`` hand their first batch
    on (its ledger is registered and written once the next one is asked for), note the
    attempt's ledger in ``marker``, and die: with ``os._exit`` (the attempt cannot clean
    up) if ``marker`` is given, else with an exception."""
    def fault(batches):
        from pyspark import TaskContext
        context = TaskContext.get()
        if context.partitionId() != 1 or context.attemptNumber() not in attempts:
            yield from batches
            return
        yield next(batches)
        if marker:
            from pybk.log import jobs as job_records
            from pybk.log.metadata import jobs_path as path_of_jobs
            from pybk.meta.zookeeper import ZooKeeperMetadataStore
            with ZooKeeperMetadataStore(address) as store:
                Path(marker).write_text(" ".join(
                    str(r.ledger_id) for job in store.children(path_of_jobs(log_name))
                    for r in job_records.job_ledgers(store, log_name, job)
                    if (r.partition, r.attempt) == (1, context.attemptNumber())))
            os._exit(3)
        raise RuntimeError("partition 1 fails on purpose")
    return fault


def test_a_task_attempt_that_dies_leaves_no_duplicate_and_no_ledger(
        spark, address, bk, log_name, tmp_path, small_arrow_batches):
    """Partition 1's first attempt writes a ledger and its process dies; the retry
    succeeds.  Every record is in the log once, and the dead attempt's ledger is
    deleted by the commit."""
    marker = tmp_path / "dead-attempt"
    source = faulty_pybk(spark, "pybk_dies_once", _dies_after_its_first_batch(
        address, log_name, str(marker), attempts=(0,)))
    numbered(spark, 4_000, 4).write.format(source).option("metadataServiceUri", address) \
        .option("log", log_name).mode("append").save()
    assert records(bk, log_name) == expected(4_000)  # each once, in partition order
    [dead] = map(int, marker.read_text().split())
    assert dead not in ledgers_of(bk, log_name)
    assert ledgers_of(bk, log_name) == segment_ledgers(bk, log_name)
    assert pending_jobs(bk, log_name) == []


def lossy_pybk(spark, name: str, address: str, marker: str) -> str:
    """Register a ``pybk`` data source named ``name`` whose commit loses the answer to
    its CAS (tests/commitutil.py): the CAS lands, another client cleans the log's orphans
    (there are none, but its CAS takes the committed job off the head's list), writes
    ``marker``, then the committer's store answers BadVersion.  Return the name."""
    import commitutil
    from pyspark import cloudpickle

    from pybk.spark.batch_write import BatchWriter
    from pybk.spark.options import WRITE, parse
    from pybk.spark.source import PybkDataSource

    cloudpickle.register_pickle_by_value(commitutil)

    class LossyWriter(BatchWriter):
        def commit(self, messages):
            import contextlib

            from pybk.errors import BadVersion
            from pybk.log.commit import clean_orphans
            from pybk.spark import job_write

            connect = job_write.connect

            def clean_meanwhile():
                with connect(self.opts) as other:
                    assert clean_orphans(other, self.opts.log, 3600) == []
                Path(marker).write_text("lost")

            @contextlib.contextmanager
            def losing(opts):
                with connect(opts) as bk:
                    bk.metadata = commitutil.LosesCommitAnswer(
                        bk.metadata, opts.log, self.job_id, clean_meanwhile, BadVersion)
                    yield bk

            job_write.connect = losing  # (a reused worker gets the real one back)
            try:
                BatchWriter.commit(self, messages)
            finally:
                job_write.connect = connect

    class LossySource(PybkDataSource):
        @classmethod
        def name(cls):
            return name

        def writer(self, schema, overwrite):
            return LossyWriter(parse(self.options, WRITE), schema, overwrite)

    spark.dataSource.register(LossySource)
    return name


def test_a_write_whose_commit_answer_is_lost_succeeds_with_its_rows_once(
        spark, address, bk, log_name, tmp_path):
    """The commit's CAS lands, another client takes the job off the head's list, and the
    committer's store answers BadVersion (as the ZooKeeper store does when a lost
    connection's retry finds the head moved on): the write succeeds, and every row is in
    the log once; a second write appends after it."""
    marker = tmp_path / "lost"
    source = lossy_pybk(spark, "pybk_loses_answer", address, str(marker))
    numbered(spark, 3_000, 3).write.format(source).option("metadataServiceUri", address) \
        .option("log", log_name).mode("append").save()
    assert marker.read_text() == "lost"
    assert records(bk, log_name) == expected(3_000)
    assert ledgers_of(bk, log_name) == segment_ledgers(bk, log_name)
    assert pending_jobs(bk, log_name) == []
    writer(spark.createDataFrame([(b"next",)], "value binary"), address, log_name) \
        .mode("append").save()
    assert records(bk, log_name) == expected(3_000) + [b"next"]


def test_a_job_that_fails_before_its_commit_leaves_nothing(spark, address, bk, log_name,
                                                           small_arrow_batches):
    """Partition 1 fails in every attempt after writing a ledger: Spark aborts the job,
    and nothing of it stays, neither records nor ledgers."""
    source = faulty_pybk(spark, "pybk_always_fails", _dies_after_its_first_batch(
        address, log_name, "", attempts=(0, 1, 2)))
    with pytest.raises(Exception, match="fails on purpose"):
        numbered(spark, 2_000, 2).write.format(source) \
            .option("metadataServiceUri", address).option("log", log_name) \
            .mode("append").save()
    assert records(bk, log_name) == []
    assert ledgers_of(bk, log_name) == set()
    assert pending_jobs(bk, log_name) == []


def test_a_driver_killed_before_its_commit_leaves_orphans_that_a_later_job_deletes(
        spark, address, bk, log_name, tmp_path):
    marker = tmp_path / "committing"
    with open(tmp_path / "child.log", "wb") as output:
        child = subprocess.Popen(
            [sys.executable, os.path.join(TESTS, "spark_write_child.py"), address,
             log_name, str(marker)],
            env=dict(child_env(), PYTHONPATH=os.pathsep.join((child_env()["PYTHONPATH"],
                                                              TESTS))),
            stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True)
    commit_pid = None
    try:
        deadline = time.monotonic() + 180
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), (tmp_path / "child.log").read_text()[-3000:]
        marked = time.monotonic()  # the orphan's tasks wrote their last before this
        job_id, commit_pid = marker.read_text().split()
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(30)
        if commit_pid is not None:  # Spark's Python workers have a group of their own
            try:
                os.kill(int(commit_pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    orphaned = ledgers_of(bk, log_name)
    assert records(bk, log_name) == [] and len(orphaned) >= 4
    assert pending_jobs(bk, log_name) == [job_id]

    time.sleep(max(0.0, marked + 1.5 - time.monotonic()))  # older than the timeout
    writer(numbered(spark, 10, 1), address, log_name,
           orphanTimeoutSeconds="1").mode("append").save()
    assert records(bk, log_name) == expected(10)
    assert not orphaned & ledgers_of(bk, log_name)
    assert pending_jobs(bk, log_name) == []


@pytest.mark.processes
def test_a_secured_cluster_is_written_and_read_with_the_credentials_options(
        spark, zookeeper, tmp_path, log_name):
    """CURVE and ZooKeeper ACLs on: a batch write and a batch read given the key file and
    the ZooKeeper credentials file as options (read where each task runs: here, the same
    machine) go through; without them, or with a missing key file, the job fails on the
    driver with the reason."""
    with secured_cluster_of_bookies(zookeeper, tmp_path, 3) as secured:
        credentials = {"zmqCurveEnabled": "true",
                       "zmqCurveSecretKeyFile": secured.keys.client_secret,
                       "zkEnableSecurity": "true",
                       "zkDigestAuthFile": secured.zk_settings.zkDigestAuthFile}
        writer(numbered(spark, 2_000, 4), secured.address, log_name,
               **credentials).mode("append").save()
        rows = (spark.read.format("pybk").option("metadataServiceUri", secured.address)
                .option("log", log_name).options(**credentials).load())
        assert [row.value for row in rows.collect()] == expected(2_000)
        with pytest.raises(Exception, match="NoAuth"):
            writer(numbered(spark, 10, 1), secured.address, log_name,
                   zmqCurveEnabled="true",
                   zmqCurveSecretKeyFile=secured.keys.client_secret).mode("append").save()
        missing = dict(credentials, zmqCurveSecretKeyFile=str(tmp_path / "missing"))
        with pytest.raises(Exception, match="zmqCurveSecretKeyFile=.*missing.*no such file"):
            spark.read.format("pybk").option("metadataServiceUri", secured.address) \
                .option("log", log_name).options(**missing).load().collect()


def test_overwrite_replaces_the_log_in_the_same_commit(spark, address, bk, log_name):
    writer(numbered(spark, 300, 3), address, log_name).mode("append").save()
    first = ledgers_of(bk, log_name)
    writer(spark.createDataFrame([(b"new",)], "value binary"), address, log_name) \
        .mode("overwrite").save()
    assert records(bk, log_name) == [b"new"]
    assert not first & ledgers_of(bk, log_name)


def test_a_job_writes_a_wal_directory_its_tasks_taking_it_in_turns(spark, tmp_path):
    """``save(path)`` of a WAL directory: the tasks open its storage one after the
    other; the WAL then opens with the job's records after its own."""
    import pybk
    directory = tmp_path / "wal"
    with pybk.open(directory) as wal:
        first = wal.append(b"the application's")
    numbered(spark, 3_000, 3).write.format("pybk").mode("append").save(str(directory))
    with pybk.open(directory) as wal:
        found = list(wal.read())
        assert found[0] == (first, b"the application's")
        assert [value for _position, value in found[1:]] == expected(3_000)
        later = wal.append(b"after the job")
        assert list(wal.read())[-1] == (later, b"after the job")


# -- streaming writes -----------------------------------------------------------------------


def test_a_replayed_micro_batch_commits_nothing_twice(spark, address, bk, log_name,
                                                      tmp_path):
    """A query's micro-batch is committed, then its commit is forgotten by the
    checkpoint (as if the driver died between the sink's commit and Spark's own): the
    restarted query replays it, and the sink, finding the batch id recorded, commits
    nothing.  The next micro-batch is committed as usual."""
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    (source / "a.txt").write_text("a1\na2\n")

    def run_query():
        query = (spark.readStream.format("text").load(str(source))
                 .writeStream.format("pybk").option("metadataServiceUri", address)
                 .option("log", log_name).option("sinkId", "copy")
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(WAIT_S)
        finally:
            query.stop()
        assert query.exception() is None

    run_query()
    assert records(bk, log_name) == [b"a1", b"a2"]
    for name in ("0", ".0.crc"):  # Spark replays batch 0
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    run_query()
    assert records(bk, log_name) == [b"a1", b"a2"]
    (source / "b.txt").write_text("b1\n")
    run_query()
    assert records(bk, log_name) == [b"a1", b"a2", b"b1"]
    head = read_log(bk.metadata, log_name).metadata
    assert head.sinks == {"copy": 1}
    assert ledgers_of(bk, log_name) == segment_ledgers(bk, log_name)
    assert pending_jobs(bk, log_name) == []


def test_a_query_restarted_from_a_deleted_checkpoint_is_told_to_take_a_new_sink_id(
        spark, address, bk, log_name, tmp_path):
    """A query commits batches 0 and 1; its checkpoint is deleted and it starts again
    under the same sinkId, at batch 0: instead of skipping its batches silently, the
    query fails, saying to start over under a new sinkId; under a new one it writes."""
    source = tmp_path / "in"
    source.mkdir()

    def run_query(sink_id: str, checkpoint: Path):
        query = (spark.readStream.format("text").option("maxFilesPerTrigger", 1)
                 .load(str(source)).writeStream.format("pybk")
                 .option("metadataServiceUri", address).option("log", log_name)
                 .option("sinkId", sink_id).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(WAIT_S)
        except Exception as e:  # the query's failure, also in query.exception()
            return str(e)
        finally:
            query.stop()
        return None

    (source / "a.txt").write_text("a\n")
    (source / "b.txt").write_text("b\n")
    os.utime(source / "a.txt", (1_000_000, 1_000_000))  # read first: the older file
    assert run_query("copy", tmp_path / "checkpoint") is None
    assert records(bk, log_name) == [b"a", b"b"]
    failure = run_query("copy", tmp_path / "checkpoint-again")
    assert failure is not None and "start over under a new sinkId" in failure
    assert records(bk, log_name) == [b"a", b"b"]
    assert run_query("copy-2", tmp_path / "checkpoint-new") is None
    assert records(bk, log_name) == [b"a", b"b", b"a", b"b"]


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("select, message", [
    ("cast(id as int) as value", "column 'value' is int: the pybk data source writes it as "
                                 "binary"),
    ("cast(cast(id as string) as binary) as value, id as key",
     "column 'key' is bigint: the pybk data source writes it as binary or string"),
    ("cast(cast(id as string) as binary) as value, id",
     "this DataFrame has \\['value', 'id'\\]"),
])
def test_a_dataframe_the_source_cannot_write_is_refused_before_any_task(
        spark, address, bk, log_name, select, message):
    with pytest.raises(Exception, match=message):
        writer(spark.range(3).selectExpr(*select.split(", ")), address, log_name) \
            .mode("append").save()
    assert pending_jobs(bk, log_name) == []


def test_a_streaming_write_without_sink_id_is_refused(spark, address, log_name, tmp_path):
    (tmp_path / "in").mkdir()
    stream = (spark.readStream.format("text").load(str(tmp_path / "in")).writeStream
              .format("pybk").option("metadataServiceUri", address).option("log", log_name)
              .option("checkpointLocation", str(tmp_path / "checkpoint"))
              .trigger(availableNow=True))
    (tmp_path / "in" / "a.txt").write_text("a\n")
    query = stream.start()
    try:
        query.awaitTermination(WAIT_S)
    except Exception as e:
        assert "option sinkId is required" in str(e)
    else:
        pytest.fail("the query ran without a sinkId")
    finally:
        query.stop()


def test_a_log_name_that_cannot_be_one_is_refused_on_the_driver(spark, address):
    with pytest.raises(Exception, match="option log='a/b' cannot name a log"):
        writer(numbered(spark, 3, 1), address, "a/b").mode("append").save()


def test_a_wrong_metadata_service_uri_fails_on_the_driver_with_the_reason(
        spark, zookeeper, log_name):
    unformatted = zookeeper.address(zkutil.fresh_root())
    with pytest.raises(Exception, match="no cluster is formatted at"):
        writer(numbered(spark, 3, 1), unformatted, log_name).mode("append").save()
