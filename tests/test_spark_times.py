"""Spark reads that start and end at a time (options ``startingTimestamp`` and
``endingTimestamp``, one number or a JSON object by log): a batch read of two logs
selects exactly the records from the first at or after the start time up to the first
at or after the end time (exclusive), with unordered caller timestamps across segments,
on ZooKeeper and on a WAL directory (the embedded store); a streaming query starts by
time, then goes on from its checkpoint (a log that joins later from its earliest
record); and bad values, or a position and a time for the same bound, are refused on
the driver.

The reference is computed here from what was appended (:func:`_expected`), never by
``position_at``.  Real Spark in local mode (the worker's shared session), a real
ZooKeeper and three bookies of this process (the module's cluster).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os

import pytest
from test_spark_logs import _load, _rows, _values
from test_spark_read import _fails_before_any_task
from test_spark_stream import SETTINGS, WAIT_S, FileSink, _running

import pybk
from pybk.log import LogWriter, Position

pytestmark = pytest.mark.timeout(300)

T0 = 1_764_028_800_000
#: Records of about 100 bytes, a few to an entry: several segments for 60 of them.
SMALL_SEGMENTS = dataclasses.replace(SETTINGS, segmentMaxBytes=1024, batchMaxBytes=256)

Written = list[tuple[Position, bytes, int]]


def _stamps(count: int, late: tuple[int, ...] = (), early: tuple[int, ...] = ()) -> list[int]:
    """Timestamps 10 ms apart from T0, except the records ``late`` (250 ms before their
    turn: a late arrival) and ``early`` (1 s ahead: a clock running fast)."""
    return [T0 + 10 * i - 250 * (i in late) + 1000 * (i in early) for i in range(count)]


def _append_timed(bk, log: str, stamps: list[int], first: int = 0) -> Written:
    """Records with the caller's timestamps ``stamps``, appended to ``log`` in that
    order; each value names its log and its number from ``first`` on (``b"<log> <n>"``,
    padded to about 100 bytes)."""
    with LogWriter.open(bk, log, SMALL_SEGMENTS) as writer:
        values = [b"%s %05d " % (log.encode(), first + i) + bytes(90)
                  for i in range(len(stamps))]
        futures = [writer.append_async(v, timestamp=t) for v, t in zip(values, stamps)]
        return [(f.result(timeout=30), v, t) for f, v, t in zip(futures, values, stamps)]


def _segments(written: Written) -> int:
    return len({p.segment for p, _, _ in written})


def _first_at_least(written: Written, timestamp: int | None) -> int:
    """The index of the first record (in position order) whose timestamp is at least
    ``timestamp``; the number of records if none is (and for None)."""
    return next((i for i, (_, _, t) in enumerate(written)
                 if timestamp is not None and t >= timestamp), len(written))


def _expected(log: str, written: Written, start: int | None = None,
              end: int | None = None) -> list[tuple[str, Position, bytes]]:
    """The rows a read of ``log`` from time ``start`` to time ``end`` (None: from the
    beginning, to the end) gives."""
    first = 0 if start is None else _first_at_least(written, start)
    return [(log, p, v) for p, v, _ in written[first:_first_at_least(written, end)]]


@pytest.fixture(scope="module")
def timed(bk):
    """Two logs over several segments with unordered timestamps, by name."""
    found = {"times-a": _append_timed(bk, "times-a", _stamps(60, late=(15, 31, 47))),
             "times-b": _append_timed(bk, "times-b", _stamps(40, late=(22,), early=(30,)))}
    assert all(_segments(written) >= 2 for written in found.values())
    return found


def test_a_batch_read_starts_and_ends_at_times_with_unordered_timestamps(
        spark, address, timed):
    a, b = timed["times-a"], timed["times-b"]
    start, end = T0 + 100, T0 + 400
    both = _load(spark.read, address, log="times-a,times-b", startingTimestamp=start,
                 endingTimestamp=str(end))
    selected = _expected("times-a", a, start, end) + _expected("times-b", b, start, end)
    assert _rows(both) == selected
    late = {v for p, v, t in a + b if t < start}
    assert late & {v for _, _, v in selected}  # late records after the start are read
    assert _first_at_least(b, end) == 30  # an early record ends it before smaller ones
    # By log (JSON objects): a start time for one log and a position for the other, an
    # end time for the second only; a time after every record: the log's end.
    by_log = _load(spark.read, address, logPattern="times-.*",
                   startingTimestamp=json.dumps({"times-a": T0 + 305}),
                   startingPosition=json.dumps({"times-b": str(b[7][0])}),
                   endingTimestamp=json.dumps({"times-b": T0 + 330}))
    assert _first_at_least(b, T0 + 330) == 30
    assert _rows(by_log) == _expected("times-a", a, T0 + 305) + \
        [("times-b", p, v) for p, v, _ in b[7:30]]
    assert _load(spark.read, address, log="times-a", startingTimestamp=T0 + 10_000).count() == 0
    assert _rows(_load(spark.read, address, log="times-b", endingTimestamp=T0 + 10_000)) == \
        _expected("times-b", b)


def test_a_wal_directory_is_read_from_a_time_to_a_time(spark, tmp_path):
    """The embedded metadata store: a WAL directory read by path."""
    stamps = _stamps(120, late=(40, 90), early=(70,))
    values = [b"wal %05d " % i + bytes(40) for i in range(len(stamps))]
    with contextlib.closing(pybk.open(str(tmp_path / "wal"), segmentMaxBytes=2048,
                                              batchMaxBytes=512)) as wal:
        futures = [wal.append_async(v, timestamp=t) for v, t in zip(values, stamps)]
        written = [(f.result(timeout=30), v, t) for f, v, t in zip(futures, values, stamps)]
    assert _segments(written) >= 2
    start, end = T0 + 300, T0 + 950
    df = (spark.read.format("pybk").option("startingTimestamp", start)
          .option("endingTimestamp", end).load(str(tmp_path / "wal")))
    assert _rows(df) == _expected("wal", written, start, end)


def test_a_streaming_query_starts_at_a_time_then_goes_on_from_its_checkpoint(
        spark, address, bk, tmp_path):
    """The first run starts each log at its first record at or after the time; the
    second goes on from the checkpoint (records with earlier timestamps appended in
    between are read), and a log created in between is read from its earliest record."""
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    os.makedirs(out)
    start = T0 + 200
    timed = {"stream-a": _append_timed(bk, "stream-a", _stamps(40, late=(25,))),
             "stream-b": _append_timed(bk, "stream-b", _stamps(30, early=(5,)))}
    assert all(_segments(written) >= 2 for written in timed.values())

    def run() -> None:
        df = _load(spark.readStream, address, logPattern="stream-.*", startingTimestamp=start,
                   maxRecordsPerTrigger=25)
        query = (df.writeStream.foreach(FileSink(out)).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        with _running(query):
            assert query.awaitTermination(WAIT_S)
            assert query.exception() is None

    run()
    first = [v for log, written in sorted(timed.items())
             for _, v, _ in written[_first_at_least(written, start):]]
    assert sorted(_values(out)) == sorted(first)
    later = [v for log, stamps, first in (("stream-a", [T0 - 5000] * 5, 40),
                                          ("stream-c", _stamps(10), 0))
             for _, v, _ in _append_timed(bk, log, stamps, first)]  # all before start
    run()
    assert sorted(_values(out)) == sorted(first + later)


def test_bad_times_fail_on_the_driver_before_any_task(spark, address, timed):
    for options, match in (  # more cases, when parsed: test_spark_options.py
            ({"startingTimestamp": "-1"}, "a timestamp is 0 or more"),
            ({"endingTimestamp": "yesterday"}, "expected a whole number of milliseconds"),
            ({"startingTimestamp": T0, "startingPosition": "earliest"},
             "startingPosition and startingTimestamp both give the start of every log"),
            ({"endingTimestamp": json.dumps({"times-a": T0}),
              "endingPosition": json.dumps({"times-a": "1:0:0"})},
             "both give the end of log 'times-a'")):
        _fails_before_any_task(
            spark, lambda options=options: _load(spark.read, address, log="times-a",
                                                 **options).collect(), match)
