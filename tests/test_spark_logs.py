"""Spark reads of several pybk logs in one query (options ``log`` with a list and
``logPattern``): a batch read of three logs, by list and by pattern, with positions by
log; a micro-batch's bound shared out among the logs, and the query's consumer in each
log (the planning methods called directly); a streaming query over a pattern that picks
up a log created while it runs, goes on past one deleted while it runs and resumes from
its checkpoint with every record exactly once; a checkpoint of a single-log query whose
offsets are of the form written before offsets were kept by log; and bad options
refused on the driver.

Real Spark in local mode (the worker's shared session), a real ZooKeeper and three
``pybk bookie`` processes; the logs are written by LogWriters of this process.  (The
streaming tests of one log are in test_spark_stream.py, whose helpers these reuse.)
"""

from __future__ import annotations

import glob
import json
import os

import pytest
from test_spark_read import _fails_before_any_task
from test_spark_stream import SETTINGS, WAIT_S, FileSink, _batch_sizes, _running, _wait

from pybk.log import LogWriter, Position, consumers
from pybk.log.metadata import delete_log
from pybk.spark.options import STREAM_READ, parse
from pybk.spark.stream_read import StreamReader

pytestmark = pytest.mark.timeout(300)


def _append(bk, log: str, count: int, first: int = 0) -> list[tuple[Position, bytes]]:
    """``count`` records appended to ``log`` by a writer of its own; each value names
    its log and its number from ``first`` on (``b"<log> <n>"``)."""
    with LogWriter.open(bk, log, SETTINGS) as writer:
        values = [b"%s %05d" % (log.encode(), i) for i in range(first, first + count)]
        futures = [writer.append_async(v) for v in values]
        return [(f.result(timeout=30), v) for f, v in zip(futures, values)]


def _load(reader, address, **options):
    """A DataFrame of the ``pybk`` source of ``reader`` (``spark.read`` or
    ``spark.readStream``) with ``options``."""
    reader = reader.format("pybk").option("metadataServiceUri", address)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _rows(df) -> list[tuple[str, Position, bytes]]:
    """A DataFrame's rows as (log, position, value), in the order collect() gives."""
    return [(r.log, Position(r.segment, r.entry, r.slot), bytes(r.value))
            for r in df.collect()]


def test_a_batch_read_reads_several_logs_by_list_or_by_pattern(spark, address, bk):
    written = {log: _append(bk, log, 60) for log in ("fleet-a", "fleet-b", "fleet-c")}
    _append(bk, "fleet", 5)  # matches neither the list nor the pattern

    def expected(logs, start=None, end=None):
        return [(log, p, v) for log in logs for p, v in written[log]
                if (start is None or log not in start or p >= start[log])
                and (end is None or log not in end or p < end[log])]

    # Partitions come by log (in the list's order, or by name), each in position order.
    listed = _load(spark.read, address, log="fleet-c, fleet-a,fleet-b", minPartitions=4)
    assert listed.rdd.getNumPartitions() >= 4
    assert _rows(listed) == expected(["fleet-c", "fleet-a", "fleet-b"])
    everything = expected(["fleet-a", "fleet-b", "fleet-c"])
    assert _rows(_load(spark.read, address, logPattern="fleet-.*")) == everything
    start = {"fleet-a": written["fleet-a"][10][0]}
    end = {"fleet-b": written["fleet-b"][20][0], "fleet-c": written["fleet-c"][0][0]}
    bounded = _load(spark.read, address, logPattern="fleet-[ab]|fleet-c",
                    startingPosition=json.dumps({k: str(p) for k, p in start.items()}),
                    endingPosition=json.dumps({k: str(p) for k, p in end.items()}))
    assert _rows(bounded) == expected(["fleet-a", "fleet-b", "fleet-c"], start, end)
    assert _load(spark.read, address, logPattern="nothing-.*").count() == 0


def test_bad_log_options_fail_on_the_driver_before_any_task(spark, address, bk):
    _append(bk, "bad-a", 3)
    for options, match in (  # more cases, when parsed: test_spark_options.py
            ({"log": "bad-a,nope"}, "there is no log named 'nope'"),
            ({"log": "bad-a", "logPattern": "bad-.*"}, "give one of them"),
            ({"logPattern": "bad-.*", "startingPosition": "0:0:0"},
             "a position is one log's")):
        _fails_before_any_task(
            spark, lambda options=options: _load(spark.read, address, **options).collect(),
            match)


def test_a_micro_batch_bound_is_shared_out_among_the_logs_and_each_log_has_a_consumer(
        address, bk):
    """The planning methods called as Spark's offsets process calls them: of 60 records,
    each log in turn takes what is left divided by the logs still to come; the consumer
    is registered in each log, a log that joins too."""
    a, b, c = (_append(bk, log, n) for log, n in (("share-a", 100), ("share-b", 5),
                                                   ("share-c", 100)))
    _append(bk, "share-d", 0)  # no records: no share
    reader = StreamReader(parse({"metadataServiceUri": address, "logPattern": "share-.*",
                                 "startingPosition": "earliest", "consumerId": "etl",
                                 "maxRecordsPerTrigger": "60"}, STREAM_READ))
    start = reader.initialOffset()
    assert start == dict.fromkeys(["share-a", "share-b", "share-c", "share-d"], "0:0:0")
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end["share-a"] == str(a[20][0])  # 60 / 3
    assert Position.parse(end["share-b"]) > b[-1][0]  # all 5 (of 40 / 2)
    assert end["share-c"] == str(c[35][0])  # the 35 left
    assert end["share-d"] == "1:0:0"  # past its empty segment
    reader.commit(end)
    _append(bk, "share-e", 3)
    later = reader.latestOffset(end, reader.getDefaultReadLimit())
    assert later["share-e"] == "0:0:0"  # joins at its start: read from the next batch
    reader.commit(later)
    assert {log: str(consumers.get(bk.metadata, log, "etl").position) for log in later} \
        == later


def _values(out: str) -> list[bytes]:
    return [value for _, value in FileSink.records(out)]


def _end_offset(query) -> dict:
    """The end offset of the query's last micro-batch."""
    return json.loads(query.lastProgress["sources"][0]["endOffset"])


def test_a_pattern_query_picks_up_a_new_log_and_resumes_from_its_checkpoint_exactly_once(
        spark, address, bk, tmp_path):
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    os.makedirs(out)
    written = [v for log in ("s-a", "s-b", "s-c") for _, v in _append(bk, log, 20)]
    _append(bk, "t-a", 10)  # another log, not matched

    def start(**trigger):
        df = _load(spark.readStream, address, logPattern="s-.*", startingPosition="earliest",
                   maxRecordsPerTrigger=30)
        return (df.writeStream.foreach(FileSink(out)).option("checkpointLocation", checkpoint)
                .trigger(**trigger).start())

    with _running(start(processingTime="0.2 seconds")) as query:
        _wait("the three logs' records in the sink",
              lambda: len(FileSink.records(out)) >= len(written), query)
        written += [v for _, v in _append(bk, "s-d", 10)]  # created while it runs
        _wait("the new log's records in the sink",
              lambda: len(FileSink.records(out)) >= len(written), query)
        delete_log(bk.metadata, "s-b")  # while it runs: the query reads it no more
        _wait("an end offset without the deleted log",
              lambda: sorted(_end_offset(query)) == ["s-a", "s-c", "s-d"], query)
        assert max(_batch_sizes(query)) <= 30
    written += [v for log, first in (("s-a", 20), ("s-c", 20), ("s-d", 10))
                for _, v in _append(bk, log, 10, first)]  # while it is stopped
    with _running(start(availableNow=True)) as query:  # from the checkpoint
        assert query.awaitTermination(WAIT_S)
        assert query.exception() is None
    got = _values(out)
    assert sorted(got) == sorted(written)  # each once, through the restart
    for log in (b"s-a", b"s-b", b"s-c", b"s-d"):  # each log's in position order
        assert [v for v in got if v.split()[0] == log] == \
            [v for v in written if v.split()[0] == log]


def test_a_checkpoint_with_offsets_of_one_log_written_before_offsets_by_log_is_read(
        spark, address, bk, tmp_path):
    """The offsets a query of one log wrote before offsets were kept by log,
    ``{"position": "segment:entry:slot"}``, put back into the checkpoint by hand."""
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    os.makedirs(out)
    written = [v for _, v in _append(bk, "single", 40)]

    def run() -> None:
        df = _load(spark.readStream, address, log="single", startingPosition="earliest")
        query = (df.writeStream.foreach(FileSink(out))
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        with _running(query):
            assert query.awaitTermination(WAIT_S)
            assert query.exception() is None

    run()
    rewritten = 0
    for path in glob.glob(os.path.join(checkpoint, "offsets", "[0-9]*")):
        with open(path) as f:
            lines = f.read().splitlines()
        offset = json.loads(lines[-1])
        assert list(offset) == ["single"]
        lines[-1] = json.dumps({"position": offset["single"]})
        with open(path, "w") as f:
            f.write("\n".join(lines))
        rewritten += 1
    assert rewritten
    written += [v for _, v in _append(bk, "single", 40, 40)]
    run()
    assert _values(out) == written
