"""Planning a log's reads (pybk.log.ranges): the ranges between two positions, split for
parallel readers, read back record by record; a live writer never disturbed.

Real bookies in this process (tests/clientutil.py); one client writes, another plans and
reads, as a job's driver and tasks would.
"""

from __future__ import annotations

import random

import pytest
from clientutil import Cluster

from pybk.errors import NoSuchLog, RecordsTruncated
from pybk.log import LogReader, LogWriter, Position
from pybk.log.ranges import ReadRange, plan, read_records, split_ranges
from pybk.settings import LogSettings
from pybk.testing import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(90)

SETTINGS = LogSettings(ensembleSize=3, writeQuorumSize=2, ackQuorumSize=2,
                       segmentMaxBytes=4096, batchMaxBytes=1024, maxOutstandingBatches=2)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path), 3)
    yield c
    c.close()


def _write(writer: LogWriter, count: int, first: int = 0) -> list[tuple[Position, bytes]]:
    """``count`` records appended together, so that entries hold several each."""
    values = [b"record %05d " % i + bytes(40) for i in range(first, first + count)]
    futures = [writer.append_async(v) for v in values]
    return [(f.result(timeout=WAIT_S), v) for f, v in zip(futures, values)]


def _read(bk, ranges: list[ReadRange]) -> list[tuple[Position, bytes]]:
    return [record for r in ranges for record in read_records(bk, r)]


def test_a_plan_covers_every_record_once_in_order_however_it_is_split(cluster):
    with LogWriter.open(cluster.client(), "log", SETTINGS) as writer:
        written = _write(writer, 600)
    bk = cluster.client()
    assert len({p.segment for p, _ in written}) >= 4
    assert any(p.slot > 0 for p, _ in written)  # entries with several records
    whole = plan(bk, "log")
    assert whole.start == Position(0, 0, 0)
    assert whole.ranges and all(r.segment == r.start.segment for r in whole.ranges)
    assert _read(bk, whole.ranges) == written == list(LogReader(bk, "log").read())
    for parts in (2, 7, 25):
        split = plan(bk, "log", min_ranges=parts)
        assert len(split.ranges) >= parts
        assert split.end == whole.end
        assert _read(bk, split.ranges) == written
    entries = sum(r.entries for r in whole.ranges)
    assert len(plan(bk, "log", min_ranges=entries * 10).ranges) == entries  # one each


def test_start_and_end_positions_bound_the_records_inclusive_and_exclusive(cluster):
    with LogWriter.open(cluster.client(), "log", SETTINGS) as writer:
        written = _write(writer, 300)
    bk = cluster.client()
    positions = [p for p, _ in written]
    rng = random.Random(7)
    for _ in range(25):
        i, j = sorted(rng.sample(range(len(positions)), 2))
        got = plan(bk, "log", positions[i], positions[j], min_ranges=rng.randint(1, 5))
        assert (got.start, got.end) == (positions[i], positions[j])
        assert _read(bk, got.ranges) == written[i:j]
        assert _read(bk, plan(bk, "log", str(positions[i]), "latest").ranges) == written[i:]
    assert plan(bk, "log", positions[5], positions[5]).ranges == []
    assert plan(bk, "log", "earliest", "earliest").ranges == []
    latest = plan(bk, "log", "latest")
    assert latest.ranges == [] and latest.start == latest.end > positions[-1]


def test_the_open_segment_is_read_to_its_lac_without_disturbing_the_writer(cluster):
    writer = LogWriter.open(cluster.client(), "log", SETTINGS)
    try:
        first = _write(writer, 200)
        writer.sync()
        bk = cluster.client()
        # The LAC reaches other readers with the next entry or the explicit LAC (how many
        # records the last entry holds depends on batching, so on the machine's load):
        # read what is visible until every synced record is, then write on; the writer
        # is not fenced.
        early, seen = None, []

        def every_synced_record_read() -> bool:
            nonlocal early, seen
            early = plan(bk, "log", min_ranges=3)
            seen = _read(bk, early.ranges)
            assert seen == first[:len(seen)]
            return len(seen) == len(first)

        wait_until(every_synced_record_read, "another reader reading every synced record "
                   "of the open segment", timeout_s=30)
        assert early is not None and early.end > seen[-1][0]
        second = _write(writer, 200, first=200)
    finally:
        writer.close()
    rest = plan(bk, "log", early.end)
    assert rest.start == early.end
    assert seen + _read(bk, rest.ranges) == first + second


def test_truncated_records_are_skipped_by_a_plan_and_fail_a_range_that_lost_them(cluster):
    bk = cluster.client()
    with LogWriter.open(cluster.client(), "log", SETTINGS) as writer:
        written = _write(writer, 400)
        old = plan(bk, "log")
        cut = next(p for p, _ in written if p.segment == 2)
        assert writer.truncate(cut) > 0
    now = plan(bk, "log", "0:0:0")
    assert now.start == cut  # the caller can tell that records it asked for are gone
    assert _read(bk, now.ranges) == [w for w in written if w[0] >= cut]
    with pytest.raises(RecordsTruncated, match="segment 0"):
        _read(bk, old.ranges)


def test_bad_input_is_a_clear_error(cluster):
    bk = cluster.client()
    with pytest.raises(NoSuchLog, match="nolog"):
        plan(bk, "nolog")
    with LogWriter.open(cluster.client(), "log", SETTINGS) as writer:
        _write(writer, 5)
    with pytest.raises(ValueError, match="past the end"):
        plan(bk, "log", Position(9, 0, 0))
    with pytest.raises(ValueError, match="start"):
        plan(bk, "log", "soon")
    with pytest.raises(ValueError, match="end"):
        plan(bk, "log", "earliest", "1:2")


def test_splitting_halves_the_largest_ranges_and_keeps_the_order():
    ranges = [ReadRange(0, 10, 5, 104, 3), ReadRange(1, 11, 0, 9, 0, 2)]
    split = split_ranges(ranges, 4)
    assert [tuple(r) for r in split] == [
        (0, 10, 5, 29, 3, None), (0, 10, 30, 54, 0, None), (0, 10, 55, 104, 0, None),
        (1, 11, 0, 9, 0, 2)]
    assert split_ranges(ranges, 1) == ranges
    assert len(split_ranges([ReadRange(0, 10, 0, 0)], 5)) == 1  # one entry stays whole
