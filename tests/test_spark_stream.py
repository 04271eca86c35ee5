"""Streaming reads of pybk logs with Spark (pybk.spark.stream_read): tailing a live writer
with admission control, a restart from the checkpoint with every record exactly once,
Trigger.AvailableNow, truncation under a running query (both failOnDataLoss settings),
a consumer holding truncation back, and bad input.

Real Spark in local mode (the worker's shared session), a real ZooKeeper and three
``pybk bookie`` processes; the logs are written by LogWriters of this process.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
import threading
import time

import pytest
import zkutil
from pyspark import cloudpickle
from pyspark.sql.streaming.datasource import ReadAllAvailable

from pybk.errors import NoSuchLedger
from pybk.log import LogWriter, Position, consumers
from pybk.log.metadata import read_log
from pybk.settings import LogSettings
from pybk.spark.options import STREAM_READ, parse
from pybk.spark.stream_read import StreamReader

pytestmark = pytest.mark.timeout(300)

SETTINGS = LogSettings(ensembleSize=3, writeQuorumSize=2, ackQuorumSize=2,
                       segmentMaxBytes=8 * 1024, batchMaxBytes=1024, maxOutstandingBatches=2)
WAIT_S = 90.0

# Spark's Python workers cannot import this module: FileSink goes to them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _write(writer: LogWriter, count: int, first: int = 0) -> list[tuple[Position, bytes]]:
    values = [b"record %05d " % i + bytes(30) for i in range(first, first + count)]
    futures = [writer.append_async(v) for v in values]
    return [(f.result(timeout=30), v) for f, v in zip(futures, values)]


def _stream(spark, address, log, **options):
    reader = (spark.readStream.format("pybk").option("metadataServiceUri", address)
              .option("log", log))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


class FileSink:
    """A foreach sink that writes each (epoch, partition) of rows to a file of its own,
    replacing it when Spark runs that epoch again: what the files hold is what the query
    committed, each epoch once."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self.path = os.path.join(self.directory, f"{epoch_id:06d}-{partition_id:04d}")
        self.lines: list[str] = []
        return True

    def process(self, row) -> None:
        self.lines.append(f"{row.position} {bytes(row.value).decode()}")

    def close(self, error) -> None:
        if error is None and self.lines:
            with open(self.path + ".tmp", "w") as f:
                f.write("\n".join(self.lines))
            os.replace(self.path + ".tmp", self.path)

    @staticmethod
    def records(directory: str) -> list[tuple[Position, bytes]]:
        found = []
        for path in sorted(glob.glob(os.path.join(directory, "[0-9]*-[0-9]*[0-9]"))):
            with open(path) as f:
                for line in f.read().splitlines():
                    position, value = line.split(" ", 1)
                    found.append((Position.parse(position), value.encode()))
        return found


def _wait(what: str, condition, query=None) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if query is not None and query.exception() is not None:
            raise AssertionError(f"the query failed while waiting for {what}: "
                                 f"{query.exception()}")
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S} s"
        time.sleep(0.2)


@contextlib.contextmanager
def _running(query):
    """``query``, stopped on the way out."""
    try:
        yield query
    finally:
        query.stop()


def _batch_sizes(query) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress]


def test_a_query_tails_a_live_writer_and_resumes_from_its_checkpoint_exactly_once(
        spark, address, bk, tmp_path):
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    os.makedirs(out)
    writer = LogWriter.open(bk, "live", SETTINGS)
    written: list = []
    stop = threading.Event()

    def append() -> None:
        while not stop.is_set() and len(written) < 3000:
            written.extend(_write(writer, 50, len(written)))
            time.sleep(0.02)

    appender = threading.Thread(target=append, name="appender")

    def start():
        df = _stream(spark, address, "live", startingPosition="earliest",
                     maxRecordsPerTrigger=150)
        return (df.writeStream.foreach(FileSink(out)).option("checkpointLocation", checkpoint)
                .trigger(processingTime="0.2 seconds").start())

    try:
        appender.start()
        with _running(start()) as query:
            _wait("1,000 records in the sink", lambda: len(FileSink.records(out)) >= 1000,
                  query)
            assert max(_batch_sizes(query)) <= 150
        with _running(start()) as query:  # from the checkpoint
            appender.join(timeout=WAIT_S)
            assert len(written) == 3000
            _wait("every record in the sink",
                  lambda: len(FileSink.records(out)) >= len(written), query)
            assert max(_batch_sizes(query)) <= 150
    finally:
        stop.set()
        appender.join(timeout=WAIT_S)
        writer.close()
    assert FileSink.records(out) == written  # each once, in order, through the restart


def test_available_now_reads_what_is_there_in_bounded_batches_and_stops(
        spark, address, bk, tmp_path):
    with LogWriter.open(bk, "now", SETTINGS) as writer:
        written = _write(writer, 1000)
    query = (_stream(spark, address, "now", startingPosition="earliest",
                     maxBytesPerTrigger=200 * 41)
             .writeStream.format("memory").queryName("now_rows")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    with _running(query):
        assert query.awaitTermination(WAIT_S)
        sizes = [n for n in _batch_sizes(query) if n]
        assert sum(sizes) == 1000 and max(sizes) <= 200 and len(sizes) >= 5
        rows = spark.sql("SELECT segment, entry, slot, value FROM now_rows").collect()
    assert sorted((Position(r.segment, r.entry, r.slot), bytes(r.value)) for r in rows) \
        == written


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_truncation_under_a_running_query(spark, address, bk, tmp_path, fail_on_data_loss):
    log = f"cut-{fail_on_data_loss}"
    writer = LogWriter.open(bk, log, SETTINGS)
    try:
        written = _write(writer, 1200)
        name = f"cut_rows_{str(fail_on_data_loss).lower()}"
        query = (_stream(spark, address, log, startingPosition="earliest",
                         maxRecordsPerTrigger=100,
                         failOnDataLoss=str(fail_on_data_loss).lower())
                 .writeStream.format("memory").queryName(name)
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(processingTime="1 second").start())
        with _running(query):
            _wait("a first micro-batch", lambda: sum(_batch_sizes(query)) > 0, query)
            cut = written[900][0]._replace(entry=0, slot=0)  # a segment's start
            writer.truncate(cut)
            if fail_on_data_loss:
                # Found when the next micro-batch is planned ("truncated before"), or by a
                # task whose planned segment went meanwhile ("truncated while it was read").
                with pytest.raises(Exception, match="RecordsTruncated.*truncated (before|"
                                                    "while it was read)") as failed:
                    query.awaitTermination(WAIT_S)
                assert "failOnDataLoss=false" in str(failed.value)
                return
            _wait("the records after the truncation point", lambda: spark.sql(
                f"SELECT count(*) AS n FROM {name} WHERE segment >= {cut.segment}")
                .first().n == sum(1 for p, _ in written if p >= cut), query)
            rows = spark.sql(f"SELECT segment, entry, slot FROM {name}").collect()
    finally:
        writer.close()
    got = [Position(*r) for r in rows]
    assert len(got) == len(set(got))  # nothing twice
    read_before = [p for p in got if p < cut]
    assert read_before == [p for p, _ in written][:len(read_before)] != []
    assert [p for p in got if p >= cut] == [p for p, _ in written if p >= cut]
    assert len(got) < len(written)  # some were skipped: they were truncated unread


def test_a_consumer_holds_back_truncation_until_the_query_read_past_it(
        spark, address, bk, tmp_path):
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    os.makedirs(out)

    def start():
        df = _stream(spark, address, "held", startingPosition="earliest",
                     maxRecordsPerTrigger=100, consumerId="etl")
        return (df.writeStream.foreach(FileSink(out)).option("checkpointLocation", checkpoint)
                .trigger(processingTime="0.2 seconds").start())

    with LogWriter.open(bk, "held", SETTINGS) as writer:
        written = _write(writer, 1000)
        with _running(start()) as query:
            _wait("the consumer registered at the query's start",
                  lambda: consumers.get(bk.metadata, "held", "etl") is not None, query)
            _wait("two committed micro-batches",
                  lambda: consumers.get(bk.metadata, "held", "etl").position > written[150][0],
                  query)
        committed = consumers.get(bk.metadata, "held", "etl").position
        # Not past the first record the sink lacks (a loaded machine may have read all).
        assert all(committed <= position for position, _ in
                   written[len(FileSink.records(out)):])
        writer.truncate(written[-1][0])
        assert read_log(bk.metadata, "held").metadata.truncated_before == committed
        with _running(start()) as query:  # nothing it has not read is gone
            _wait("every record in the sink",
                  lambda: len(FileSink.records(out)) >= len(written), query)
            # Spark commits a micro-batch's end when it plans the next one with data: the
            # last one (at most 100 records) stays held until the query moves on.
            _wait("the commit of the micro-batch before the last", lambda: consumers.get(
                bk.metadata, "held", "etl").position >= written[-100][0], query)
        assert FileSink.records(out) == written
        committed = consumers.get(bk.metadata, "held", "etl").position
        writer.truncate(written[-1][0])
        assert read_log(bk.metadata, "held").metadata.truncated_before == committed
        assert consumers.remove(bk.metadata, "held", "etl")
        writer.truncate(written[-1][0])  # nothing held back any more
        assert read_log(bk.metadata, "held").metadata.truncated_before == written[-1][0]


def test_a_consumer_at_a_dropped_empty_segment_sees_no_loss_when_truncation_skips_it(
        address, bk):
    """The planning methods called as Spark's offsets process calls them.  The query's
    position is the start of an open, empty segment; the next writer drops that segment,
    and truncation held at the consumer moves on to the next segment that exists."""
    with LogWriter.open(bk, "gap", SETTINGS) as writer:
        before = _write(writer, 20)
    reader = StreamReader(parse({"metadataServiceUri": address, "log": "gap",
                                 "startingPosition": "earliest", "consumerId": "q"},
                                STREAM_READ))
    start = reader.initialOffset()
    abandoned = LogWriter.open(bk, "gap", SETTINGS)  # an empty segment, open while read
    try:
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {"gap": "1:0:0"}  # the start of that segment
        assert [r.num_rows for p in reader.partitions(start, end)
                for r in reader.read(p)] == [len(before)]
        reader.commit(end)
        # The next writer fences the abandoned one and drops its empty segment; truncation
        # held at the consumer moves on to the next segment that exists.
        with LogWriter.open(bk, "gap", SETTINGS) as writer:
            after = _write(writer, 20)
            writer.truncate(after[5][0])
    finally:
        with contextlib.suppress(NoSuchLedger):  # deleted with the dropped segment
            abandoned.close()
    held = consumers.get(bk.metadata, "gap", "q").position
    assert read_log(bk.metadata, "gap").metadata.truncated_before > held  # skipped ahead
    newer = reader.latestOffset(end, ReadAllAvailable())
    rows = [row for p in reader.partitions(end, newer) for r in reader.read(p)
            for row in r.to_pylist()]
    assert [(Position.parse(row["position"]), row["value"]) for row in rows] == after


def test_bad_input_fails_the_query_with_a_clear_error(spark, address, bk, zookeeper,
                                                      tmp_path):
    with LogWriter.open(bk, "small", SETTINGS) as writer:
        _write(writer, 10)
    unformatted = zookeeper.address(zkutil.fresh_root())
    for where, log, options, match in (
            (address, "nope", {}, "there is no log named 'nope'"),
            (unformatted, "small", {}, "formatted"),
            (address, "small", {"startingPosition": "42:0:0"}, "past the end"),
            (address, "small", {"maxRecordsPerTrigger": "0"}, "greater than 0")):
        with pytest.raises(Exception, match=match):
            query = (_stream(spark, where, log, **options).writeStream.format("memory")
                     .queryName("bad").option("checkpointLocation",
                                              str(tmp_path / f"cp-{len(match)}"))
                     .start())
            with _running(query):
                query.awaitTermination(WAIT_S)
