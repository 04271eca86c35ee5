"""Batch reads of pybk logs with Spark (pybk.spark.batch_read): the same rows however the
read is partitioned or bounded, position order, filter pushdown, a live writer left
undisturbed, clear errors on the driver, and a WAL directory read by ``path``.

Real Spark in local mode (the worker's shared session), a real ZooKeeper and three
``pybk bookie`` processes; the log is written by a LogWriter of this process.
"""

from __future__ import annotations

import contextlib

import pytest
import zkutil

import pybk
from pybk.log import LogWriter, Position
from pybk.settings import LogSettings
from pybk.spark.batch_read import Bounds, FilteringBatchReader
from pybk.spark.options import READ, parse
from pybk.testing import wait_until

pytestmark = pytest.mark.timeout(300)

SETTINGS = LogSettings(ensembleSize=3, writeQuorumSize=2, ackQuorumSize=2,
                       segmentMaxBytes=16 * 1024, batchMaxBytes=2048, maxOutstandingBatches=2)
RECORDS = 1500


@pytest.fixture(scope="module")
def written(address):
    """RECORDS records of the log ``events`` over several segments, several per entry."""
    with pybk.connect(address) as bk, LogWriter.open(bk, "events", SETTINGS) as w:
        values = [b"event %05d " % i + bytes(60) for i in range(RECORDS)]
        futures = [w.append_async(v) for v in values]
        records = [(f.result(timeout=30), v) for f, v in zip(futures, values)]
    assert len({p.segment for p, _ in records}) >= 5
    assert any(p.slot > 0 for p, _ in records)
    return records


def _read(spark, address, **options):
    reader = spark.read.format("pybk").option("metadataServiceUri", address)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _records(rows) -> list[tuple[Position, bytes]]:
    """Rows as (position, value), checking that every row's columns agree."""
    found = []
    for row in rows:
        position = Position(row.segment, row.entry, row.slot)
        assert row.position == str(position) and row.log == "events"
        found.append((position, bytes(row.value)))
    return found


def test_every_record_is_read_once_in_position_order_however_the_read_is_split(
        spark, address, written):
    for min_partitions in (None, 3, 16):
        options = {"log": "events"}
        if min_partitions:
            options["minPartitions"] = min_partitions
        df = _read(spark, address, **options)
        assert df.rdd.getNumPartitions() >= (min_partitions or 5)  # one a segment at least
        # collect() keeps the partitions' order, and they are planned in position order.
        assert _records(df.collect()) == written
    assert _read(spark, address, log="events").count() == RECORDS


def test_starting_and_ending_positions_bound_the_rows(spark, address, written):
    positions = [p for p, _ in written]
    for i, j in ((0, 1), (3, 700), (401, 1499), (1100, RECORDS)):
        options = {"log": "events", "startingPosition": str(positions[i]), "minPartitions": 4}
        if j < RECORDS:
            options["endingPosition"] = str(positions[j])
        assert _records(_read(spark, address, **options).collect()) == written[i:j]
    assert _read(spark, address, log="events", startingPosition="latest").count() == 0


def test_segment_and_entry_filters_are_pushed_down_when_spark_allows_it(
        spark, address, written):
    expected = [(p, v) for p, v in written if 2 <= p.segment <= 3 and p.entry < 3]
    query = "segment >= 2 AND segment <= 3 AND entry < 3"
    everything = _read(spark, address, log="events", minPartitions=8)
    assert _records(everything.where(query).collect()) == expected  # Spark filters
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        narrowed = _read(spark, address, log="events", minPartitions=8).where(query)
        assert _records(narrowed.collect()) == expected
        # The filters narrowed the ranges read: only segments 2 and 3, three entries each.
        assert narrowed.rdd.getNumPartitions() <= 6 < everything.rdd.getNumPartitions()
        some = _read(spark, address, log="events").where("segment IN (1, 4)")
        assert _records(some.collect()) == [w for w in written if w[0].segment in (1, 4)]
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def test_a_live_writer_is_read_up_to_its_lac_and_goes_on_undisturbed(spark, address):
    with pybk.connect(address) as bk, LogWriter.open(bk, "live", SETTINGS) as w:
        first = [w.append(b"before %d" % i) for i in range(300)]
        rows = _read(spark, address, log="live", minPartitions=3).collect()
        positions = [Position(r.segment, r.entry, r.slot) for r in rows]
        # Other processes see the writer's entries up to the LAC the bookies know.
        assert positions == first[:len(positions)] and len(positions) >= 250
        after = w.append(b"after")  # not fenced: the read did not recover its segment
    rows = _read(spark, address, log="live").collect()
    assert [Position(r.segment, r.entry, r.slot) for r in rows] == first + [after]


def _fails_before_any_task(spark, read, match: str) -> None:
    """``read()`` raises an error matching ``match`` and no Spark job ran."""
    sc = spark.sparkContext
    sc.setJobGroup("pybk-bad-input", "a read that must fail while planned")
    try:
        with pytest.raises(Exception, match=match):
            read()
        assert sc.statusTracker().getJobIdsForGroup("pybk-bad-input") == []
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)


def test_bad_input_fails_on_the_driver_before_any_task(spark, address, written, zookeeper):
    _fails_before_any_task(spark, lambda: _read(spark, address, log="nope").collect(),
                           "there is no log named 'nope'")
    unformatted = zookeeper.address(zkutil.fresh_root())
    _fails_before_any_task(
        spark, lambda: _read(spark, unformatted, log="events").collect(), "formatted")
    _fails_before_any_task(  # nothing listens there: refused, not zkTimeout's 10 s
        spark, lambda: _read(spark, "zk://127.0.0.1:9/ledgers", log="events").collect(),
        "no ZooKeeper server listens at 127.0.0.1:9")
    _fails_before_any_task(
        spark, lambda: _read(spark, address, log="events",
                             startingPosition="99:0:0").collect(), "past the end")
    _fails_before_any_task(
        spark, lambda: _read(spark, address, log="events",
                             startingPosition="soon").collect(), "startingPosition")
    _fails_before_any_task(
        spark, lambda: _read(spark, address, log="events",
                             endingPosition="earliest").collect(), "endingPosition")
    _fails_before_any_task(
        spark, lambda: _read(spark, address, log="events", minPartition=3).collect(),
        "did you mean 'minPartitions'")


def test_a_wal_directory_is_read_by_path(spark, tmp_path):
    directory = str(tmp_path / "wal")
    with contextlib.closing(pybk.open(directory, segmentMaxBytes=2048)) as wal:
        written = [(wal.append(b"wal record %d" % i), b"wal record %d" % i)
                   for i in range(200)]
    df = spark.read.format("pybk").option("minPartitions", 4).load(directory)
    assert df.rdd.getNumPartitions() >= 4
    rows = df.collect()
    assert [(Position(r.segment, r.entry, r.slot), bytes(r.value)) for r in rows] == written
    assert {r.log for r in rows} == {"wal"}


def test_a_wal_directory_is_read_while_its_application_appends(spark, tmp_path):
    """A batch read takes no lock: the application (this process) goes on appending,
    and the job reads every record acknowledged before it was planned (the owner's
    explicit LAC, 50 ms after its appends go idle, makes the last one visible: the test
    waits for it)."""
    directory = str(tmp_path / "wal")
    with contextlib.closing(pybk.open(directory, segmentMaxBytes=2048)) as wal:
        written = [(wal.append(b"live record %d" % i), b"live record %d" % i)
                   for i in range(200)]
        last = written[-1][0]
        segment = next(s for s in wal._writer.metadata.tail if s.number == last.segment)
        wait_until(lambda: wal.bookie.read_lac(segment.ledger_id) >= last.entry,
                   "the owner's explicit LAC covers the last record")
        rows = spark.read.format("pybk").option("minPartitions", 3).load(directory).collect()
        assert [(Position(r.segment, r.entry, r.slot), bytes(r.value)) for r in rows] == \
            written
        later = wal.append(b"after the job")  # the application was not disturbed
        assert list(wal.read(later)) == [(later, b"after the job")]


def test_a_wal_directory_its_application_has_open_is_not_written_naming_the_lock(
        spark, tmp_path):
    directory = str(tmp_path / "wal")
    with contextlib.closing(pybk.open(directory)) as wal:
        wal.append(b"the application is running")
        df = spark.createDataFrame([(b"job row",)], "value binary")
        writer = df.write.format("pybk").option("lockTimeoutSeconds", 0.5).mode("append")
        with pytest.raises(Exception, match=r"(?s)DirectoryLocked.*is open in another "
                                            r"process.*LOCK is locked"):
            writer.save(directory)


def test_registering_the_source_again_changes_nothing(spark, address, written):
    import pybk.spark
    pybk.spark.register(spark)
    pybk.spark.register(spark)
    assert _read(spark, address, log="events").count() == len(written)


def test_pushed_filters_narrow_the_bounds_and_spark_keeps_the_inexact_ones():
    from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, Not
    opts = parse({"metadataServiceUri": "zk://127.0.0.1:2181/ledgers", "log": "x"}, READ)
    reader = FilteringBatchReader(opts)
    exact = [GreaterThanOrEqual(("segment",), 2), LessThan(("entry",), 3),
             GreaterThan(("segment",), 1)]
    inexact = [In(("segment",), (2, 5)), EqualTo(("value",), b"x"), GreaterThan(("slot",), 1),
               LessThan(("entry",), -1), EqualTo(("segment",), True),
               Not(EqualTo(("segment",), 3))]
    assert list(reader.pushFilters(exact + inexact)) == inexact
    assert reader.bounds == Bounds(segment_low=2, segment_high=6, entry_low=0, entry_high=3)
