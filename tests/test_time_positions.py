"""Positions by time (pybk.log.timeindex): the first record at or after a timestamp, or
the log's end, exact whatever the order of the callers' timestamps, in a bounded number
of reads; over logs rolled by a writer, reopened, committed by a job, left by a writer
that died between its roll's CAS and its record, holding version-1 batches, and written
by a pybk before the index.  Every answer is checked against the records read back
(the first one, in position order, whose timestamp is at least the target)."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import zkutil
from recordutil import write_version_1

import pybk
import pybk.aio
from pybk.client import BookKeeper
from pybk.client.ledger import LedgerHandle
from pybk.client.transport import InProcessBookieClient
from pybk.errors import BookKeeperError, NoSuchLog
from pybk.log import LogReader, LogWriter, Position, jobs, position_at, writer
from pybk.log.batch import (
    JOB_KEY,
    LOG_NAME_KEY,
    MAXIMA_KEY,
    RUNNING_MAXIMA,
    batch_time_range,
    encode_batch,
    keeps_running_maxima,
)
from pybk.log.commit import commit_job
from pybk.log.metadata import (
    MAGIC,
    NO_TIMESTAMP,
    SEGMENT_MAGIC,
    TAIL_SEGMENTS,
    LogMetadata,
    Segment,
    live_segments,
    log_path,
    mark_dead,
    read_log,
    segment_path,
    update_log,
)
from pybk.log.writer import batch_ledger_metadata
from pybk.meta.sealed import seal
from pybk.settings import ClientSettings, LogSettings

pytestmark = pytest.mark.timeout(120)

LOG = "timed"
ONE_COPY = LogSettings(ensembleSize=1, writeQuorumSize=1, ackQuorumSize=1)
#: Records of 100 bytes appended one at a time: one entry each, a few entries a segment.
SEGMENTS = dataclasses.replace(ONE_COPY, segmentMaxBytes=450)
#: A record of 300 bytes fills a segment: one entry a segment.
ONE_ENTRY_SEGMENTS = dataclasses.replace(ONE_COPY, segmentMaxBytes=256)
T0 = 1_764_028_800_000


@pytest.fixture(params=["embedded", "zookeeper"])
def client(request, tmp_path, bookie):
    """Clients of one bookie in this process, on a metadata store of either kind; the
    test gets a function that makes one (closed at the end, also if it fails)."""
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(zkutil.store_of_kind(request, tmp_path / "meta"))

        def make(settings: ClientSettings | None = None) -> BookKeeper:
            return stack.enter_context(BookKeeper(
                store, {"B1": InProcessBookieClient("B1", bookie)},
                settings or ClientSettings()))

        yield make


@pytest.fixture
def writers():
    """Opens LogWriters of LOG, closed at the end of the test (quietly: another writer
    or a commit may have fenced them)."""
    opened: list[LogWriter] = []

    def open_(bk, settings=SEGMENTS) -> LogWriter:
        opened.append(LogWriter.open(bk, LOG, settings))
        return opened[-1]

    yield open_
    for w in opened:
        with contextlib.suppress(BookKeeperError):
            w.close()


def append_all(w: LogWriter, stamps: list[int], size: int = 100) -> None:
    for i, stamp in enumerate(stamps):
        w.append(b"%d" % i + bytes(size), timestamp=stamp)


def check_every_target(bk, w: LogWriter | None = None, extra: tuple[int, ...] = ()) -> int:
    """Check position_at against the records read back, for a target before everything,
    after everything, at every record's timestamp and between each two; the number of
    targets checked."""
    records = list(LogReader(bk, LOG, writer=w).records())
    stamps = sorted({r.timestamp for r in records if r.timestamp is not None})
    targets = {0, *stamps, *(s + 1 for s in stamps), *(s - 1 for s in stamps), *extra}
    for target in sorted(targets):
        expected = next((r.position for r in records
                         if r.timestamp is not None and r.timestamp >= target), None)
        found = position_at(bk, LOG, target, writer=w)
        if expected is not None:
            assert found == expected, f"target {target}"
        else:  # the end: after every record, and reading from it gives nothing yet
            assert not records or found > records[-1].position, f"target {target}"
            assert list(LogReader(bk, LOG, found, writer=w).read()) == []
    return len(targets)


# -- writers: ordered and unordered timestamps, rolls, reopening ---------------------------


def test_ordered_timestamps_across_segments(client, writers):
    bk = client()
    w = writers(bk)
    append_all(w, [T0 + 10 * i for i in range(20)])
    assert len(read_log(bk.metadata, LOG).metadata.tail) == TAIL_SEGMENTS  # it rolled
    assert position_at(bk, LOG, T0 + 55, writer=w) == \
        list(LogReader(bk, LOG, writer=w).read())[6][0]
    check_every_target(bk, w)


def test_unordered_timestamps_late_records_and_a_segment_below_an_earlier_one(client,
                                                                              writers):
    """A late record with a small timestamp after big ones, and a whole segment whose
    maximum is below an earlier segment's: the answer is still the first record at or
    after the target in position order."""
    bk = client()
    w = writers(bk)
    stamps = [T0 + 500, T0 + 100, T0 + 900, T0 + 50,   # segment 0: max 900
              T0 + 10, T0 + 20, T0 + 30, T0 + 40,      # segment 1: all below segment 0's
              T0 + 1000, T0 + 5, T0 + 950, T0 + 2000,  # a late small one among big ones
              T0 + 1500, T0 + 1, T0 + 3000, T0 + 2500]
    append_all(w, stamps)
    assert position_at(bk, LOG, T0 + 950, writer=w) == position_at(bk, LOG, T0 + 901,
                                                                    writer=w)
    assert check_every_target(bk, w) > 40
    # Segment maxima really are unordered, and max_before never decreases.
    befores = [s.max_before for s in live_segments(bk.metadata,
                                                   read_log(bk.metadata, LOG).metadata)]
    assert befores[0] == NO_TIMESTAMP and befores == sorted(befores)


def test_batches_carry_their_ledgers_running_maximum(client, writers):
    bk = client()
    w = writers(bk, dataclasses.replace(ONE_COPY, segmentMaxBytes=100_000))
    stamps = [T0 + 30, T0 + 10, T0 + 20, T0 + 40, T0 + 5]
    append_all(w, stamps)
    ledger = bk.open_ledger(w.metadata.tail[-1].ledger_id, recovery=False)
    tops = [batch_time_range(e.data)[1]
            for e in ledger.read_entries(0, ledger.read_last_add_confirmed())]
    assert tops[:len(stamps) - 1] == [T0 + 30, T0 + 30, T0 + 30, T0 + 40]
    assert list(w.metadata.tail[-1])[:2] == [w.metadata.tail[-1].number, ledger.id]


def test_a_reopened_writer_and_one_that_died_without_closing(client, writers):
    """The opener takes the last segment's maximum from its last entry (recovered): the
    new segment's max_before covers a late writer's records too."""
    bk1, bk2, bk3 = client(), client(), client()
    first = writers(bk1)
    append_all(first, [T0 + 800, T0 + 100, T0 + 700, T0 + 300, T0 + 900, T0 + 200])
    first.close()
    second = writers(bk2)  # reopened after a close
    append_all(second, [T0 + 50, T0 + 850, T0 + 60])
    third = writers(bk3)  # the second never closed: fenced, its last segment recovered
    append_all(third, [T0 + 10, T0 + 1000, T0 + 20])
    check_every_target(bk3, third)
    tail = read_log(bk3.metadata, LOG).metadata.tail
    assert tail[-1].max_before == T0 + 900


def test_a_writer_that_died_between_its_roll_cas_and_its_record(client, writers,
                                                                 monkeypatch):
    """The roll's CAS named the new segment with its max_before in the head; the record
    was never written.  The next opener writes it from the head, and searches go on
    exact across it."""
    bk1, bk2 = client(), client()
    first = writers(bk1, ONE_ENTRY_SEGMENTS)
    append_all(first, [T0 + 500, T0 + 100], size=300)

    def dies(*args):
        raise BookKeeperError("the writer's process died here")

    monkeypatch.setattr(writer, "write_segment", dies)
    with pytest.raises(BookKeeperError):  # the roll failed: the writer stopped
        append_all(first, [T0 + 50, T0 + 700], size=300)
    monkeypatch.undo()
    head = read_log(bk2.metadata, LOG).metadata
    assert not bk2.metadata.exists(segment_path(LOG, head.tail[-1].number))
    second = writers(bk2, ONE_ENTRY_SEGMENTS)
    append_all(second, [T0 + 5, T0 + 600, T0 + 3, T0 + 400, T0 + 800], size=300)
    check_every_target(bk2, second)


def test_after_a_truncation_inside_a_segment(client, writers):
    """Records before truncated_before are never answered, also where the maxima still
    count them (a truncated record newer than the target)."""
    bk = client()
    w = writers(bk)
    append_all(w, [T0 + 5000, T0 + 100, T0 + 200, T0 + 300, T0 + 4000, T0 + 400, T0 + 500,
                   T0 + 600, T0 + 700, T0 + 800])
    positions = [p for p, _ in LogReader(bk, LOG, writer=w).read()]
    cut = next(p for p in positions if p.segment == positions[-1].segment)  # a segment's first
    w.truncate(positions[positions.index(cut) - 1])  # inside the segment before it
    head = read_log(bk.metadata, LOG).metadata
    assert head.truncated_before.entry > 0
    assert position_at(bk, LOG, T0, writer=w) == head.truncated_before
    check_every_target(bk, w)


# -- commits, version 1, older pybk ---------------------------------------------------------


def job_ledger(bk, job_id: str, partition: int, stamps: list[int]) -> int:
    """A task's ledger with running maxima in its headers (two records an entry), tagged
    as job_write tags them."""
    ledger = bk.create_ledger(1, 1, 1, custom_metadata=batch_ledger_metadata(LOG))
    jobs.register_ledger(bk, LOG, job_id, ledger.id, partition, 0)
    floor = None
    for i in range(0, len(stamps), 2):
        entry = encode_batch([b"p%d %d" % (partition, i)] * len(stamps[i:i + 2]),
                             stamps[i:i + 2], max_floor=floor)
        ledger.add_entry(entry)
        floor = batch_time_range(entry)[1]
    ledger.close()
    return ledger.id


def test_a_committed_jobs_segments(client, writers):
    """Ledgers written apart, their maxima unordered, appended by one commit after a
    writer's segments: max_before chains through them."""
    bk = client()
    w = writers(bk)
    append_all(w, [T0 + 400, T0 + 100, T0 + 300])
    job = jobs.begin_job(bk.metadata, LOG)
    ledgers = [job_ledger(bk, job, 0, [T0 + 900, T0 + 50, T0 + 60]),
               job_ledger(bk, job, 1, [T0 + 10, T0 + 20]),
               job_ledger(bk, job, 2, [T0 + 30, T0 + 1200, T0 + 40, T0 + 500])]
    assert commit_job(bk, LOG, job, ledgers).committed
    later = writers(bk)
    append_all(later, [T0 + 5, T0 + 1100])
    check_every_target(bk, later)
    befores = [s.max_before for s in live_segments(bk.metadata,
                                                   read_log(bk.metadata, LOG).metadata)]
    assert befores == sorted(befores) and befores[-1] == T0 + 1200


def test_version_1_batches_have_no_time(client, writers, monkeypatch):
    """A version 1 record is never at or after a time; version 2 records after them
    are found, and a target past them all gives the end."""
    bk = client()
    with monkeypatch.context() as old:
        write_version_1(old)
        old_writer = writers(bk)
        append_all(old_writer, [T0 + 100] * 5)
        old_writer.close()
    w = writers(bk)
    append_all(w, [T0 + 300, T0 + 200])
    records = list(LogReader(bk, LOG, writer=w).records())
    assert [r.timestamp for r in records] == [None] * 5 + [T0 + 300, T0 + 200]
    assert position_at(bk, LOG, 0, writer=w) == records[5].position
    check_every_target(bk, w)


def test_a_log_an_older_pybk_wrote_is_searched_then_indexed(client, writers):
    """Segments without max_before (head format 3, segment records of format 1) are
    searched entry by entry; the next writer starts the index after them."""
    bk = client()
    w = writers(bk)
    append_all(w, [T0 + 700, T0 + 100, T0 + 900, T0 + 50, T0 + 30, T0 + 800, T0 + 10])
    w.close()
    head, version = read_log(bk.metadata, LOG)
    for segment in live_segments(bk.metadata, head):  # as the older pybk wrote them
        if segment.number < head.tail[0].number:
            bk.metadata.set(segment_path(LOG, segment.number), seal(SEGMENT_MAGIC, 1, {
                "segment": segment.number, "ledger_id": segment.ledger_id, "skip_to": None,
                "hollow": False}), -1)
    bk.metadata.set(log_path(LOG), seal(MAGIC, 3, {
        "name": LOG, "next_segment": head.next_segment,
        "truncated_before": list(head.truncated_before),
        "tail": [[s.number, s.ledger_id] for s in head.tail],
        "oldest_segment": head.oldest_segment, "dropping": [], "epoch": head.epoch,
        "sinks": {}, "committing": [], "aborted": []}), version)
    assert all(s.max_before is None for s in live_segments(
        bk.metadata, read_log(bk.metadata, LOG).metadata))
    check_every_target(bk)
    later = writers(bk)
    append_all(later, [T0 + 20, T0 + 1000, T0 + 5])
    assert read_log(bk.metadata, LOG).metadata.tail[-1].max_before is not None
    check_every_target(bk, later)


# -- what it costs -----------------------------------------------------------------------


def test_reads_are_logarithmic_in_segments_and_entries(client, writers, monkeypatch):
    """64 segments of 4 entries, timestamps shuffled within each segment and rising
    across them: each search reads at most c * log2(64) + c records and entries."""
    bk = client()
    w = writers(bk, dataclasses.replace(ONE_COPY, segmentMaxBytes=4 * 130))
    stamps = [T0 + 100 * s + (7 * e) % 4 for s in range(64) for e in range(4)]
    append_all(w, stamps)
    head = read_log(bk.metadata, LOG).metadata
    assert head.next_segment >= 64
    reads = {"metadata": 0, "entries": 0}
    real_get, real_read_entry = bk.metadata.get, LedgerHandle.read_entry

    def counting_get(path, *args):
        reads["metadata"] += 1
        return real_get(path, *args)

    def counting_read_entry(handle, *args, **kwargs):
        reads["entries"] += 1
        return real_read_entry(handle, *args, **kwargs)

    monkeypatch.setattr(bk.metadata, "get", counting_get)
    monkeypatch.setattr(LedgerHandle, "read_entry", counting_read_entry)
    records = list(LogReader(bk, LOG, writer=w).records())
    bound = 4 * math.log2(64) + 8
    for target in (T0 + 1, T0 + 3150, T0 + 4999, T0 + 6301):
        reads.update(metadata=0, entries=0)
        found = position_at(bk, LOG, target, writer=w)
        assert found == next(r.position for r in records if r.timestamp >= target)
        assert reads["metadata"] <= bound and reads["entries"] <= bound, (target, reads)


def test_the_wal_and_its_faces(tmp_path):
    path = tmp_path / "wal"
    with pybk.open(path) as wal:
        positions = [wal.append(b"%d" % i, timestamp=T0 + stamp)
                     for i, stamp in enumerate((30, 10, 40, 20))]
        assert wal.position_at(T0 + 35) == positions[2]
        assert list(wal.records(wal.position_at(T0 + 25)))[0].value == b"0"
        end = wal.position_at(T0 + 41)
        assert list(wal.read(end)) == []
        later = wal.append(b"later", timestamp=T0)
        assert list(wal.read(end)) == [(later, b"later")]
    with pybk.open_readonly(path) as readonly:
        assert readonly.position_at(T0 + 35) == positions[2]
    with pytest.raises(TypeError):
        position_at(None, LOG, "yesterday")


@pytest.mark.asyncio
async def test_the_asyncio_faces(tmp_path):
    path = tmp_path / "wal"
    async with await pybk.aio.open(path) as wal:
        positions = [await wal.append(b"%d" % i, timestamp=T0 + stamp)
                     for i, stamp in enumerate((30, 10, 40))]
        assert await wal.position_at(T0 + 11) == positions[0]
        assert await wal.position_at(T0 + 31) == positions[2]
    async with await pybk.aio.open_readonly(path) as readonly:
        assert await readonly.position_at(T0 + 31) == positions[2]


def test_a_head_whose_max_before_values_decrease_is_refused():
    """Checked where a head is made, so no CAS can write one and no read accepts one."""
    good = LogMetadata(LOG, tail=(Segment(0, 7), Segment(1, 8, NO_TIMESTAMP),
                                  Segment(2, 9, T0)), next_segment=3)
    assert LogMetadata.from_bytes(good.to_bytes()) == good
    for tail in ((Segment(0, 7, T0), Segment(1, 8, T0 - 1)),
                 (Segment(0, 7, T0), Segment(1, 8))):
        with pytest.raises(ValueError, match="never decrease"):
            LogMetadata(LOG, tail=tail, next_segment=2)


def test_no_log_no_position(client):
    with pytest.raises(NoSuchLog):
        position_at(client(), "none", T0)


def test_an_empty_log_answers_its_start(client, writers):
    bk = client()
    writers(bk)
    assert position_at(bk, LOG, T0) == Position(0, 0, 0)


# -- review: attacks on the index ------------------------------------------------------


def test_a_search_from_another_process_stops_at_a_segment_a_roll_left_open(client, writers,
                                                                          monkeypatch):
    """A roll has CASed segment 1 in, but segment 0 is not closed yet (the roll waits for
    its adds in flight, or the writer died right after the CAS).  Another process sees
    segment 0 only up to the bookies' LAC: its last entry, acknowledged, holds the first
    record at or after the target.  A reader never passes an open segment that a later
    one follows (pybk.log.reader), so a search must not either: answering a position in
    segment 1 makes a reader started there skip that acknowledged record."""
    quiet = ClientSettings(explicitLacInterval=0)  # the LAC reaches bookies with adds only
    own, other = client(quiet), client(quiet)
    w = writers(own)
    left_open: list[LedgerHandle] = []
    monkeypatch.setattr(LogWriter, "_close_segment",
                        lambda self, ledger: left_open.append(ledger))
    append_all(w, [T0 + 100, T0 + 200, T0 + 300, T0 + 900, T0 + 400, T0 + 950])
    assert len(left_open) == 1
    found = position_at(other, LOG, T0 + 900)
    left_open[0].close()  # the roll goes on: segment 0 closes at its last entry
    records = list(LogReader(own, LOG, writer=w).records())
    assert records[3].position.segment == 0 and records[4].position.segment == 1
    assert found <= records[3].position  # a reader from it gets T0 + 900's record
    assert [r.timestamp for r in LogReader(other, LOG, found).records()][:1] == [T0 + 900]


def test_a_search_over_hollow_runs_is_logarithmic(client, writers, monkeypatch):
    """Demotion (pybk.log.promotion) makes the next segment number jump by 2**32, a hollow
    dead run with one record at its start (a format-1 conversion leaves such runs too).
    The bisection over numbers lands inside one at almost every step; find_segment would
    walk every record from truncated_before's segment to it: reads linear in the log's
    length at each step."""
    bk = client()
    w = writers(bk, ONE_ENTRY_SEGMENTS)
    append_all(w, [T0 + 10 * i for i in range(40)], size=300)
    w.close()
    for demotion in range(2):
        head, version = read_log(bk.metadata, LOG)
        gap = 1 << 32  # promotion.SEGMENT_GAP_AFTER_DEMOTION, as demote() writes it
        mark_dead(bk.metadata, LOG, head.next_segment, head.next_segment + gap, hollow=True)
        update_log(bk.metadata, dataclasses.replace(
            head, next_segment=head.next_segment + gap), version)
        later = writers(bk, ONE_ENTRY_SEGMENTS)
        append_all(later, [T0 + 1000 * (demotion + 1) + 10 * i for i in range(8)], size=300)
        later.close()
    later = writers(bk, ONE_ENTRY_SEGMENTS)
    append_all(later, [T0 + 5000, T0 + 3], size=300)
    records = list(LogReader(bk, LOG, writer=later).records())
    reads = {"metadata": 0}
    real_get = bk.metadata.get

    def counting_get(path, *args):
        reads["metadata"] += 1
        return real_get(path, *args)

    monkeypatch.setattr(bk.metadata, "get", counting_get)
    numbers = read_log(bk.metadata, LOG).metadata.next_segment
    bound = 4 * math.log2(numbers) + 8
    for target in (T0 + 205, T0 + 395, T0 + 1035, T0 + 2035, T0 + 4000):
        reads["metadata"] = 0
        assert position_at(bk, LOG, target, writer=later) == \
            next(r.position for r in records if r.timestamp >= target)
        assert reads["metadata"] <= bound, (target, reads)
    monkeypatch.undo()
    check_every_target(bk, later)


def test_a_spark_tasks_entries_carry_running_maxima(monkeypatch):
    """A Spark task's entries (pybk.spark.job_write) are stamped with the time each is
    made; a wall clock stepped back between two entries of a ledger gives a header max
    below the one before.  A commit takes the ledger's last header max as its largest
    timestamp, and a search bisects entries on them: both assume running maxima."""
    pytest.importorskip("pyspark")
    import pyarrow as pa

    from pybk.log import batch
    from pybk.spark import job_write
    clock = iter([T0 + 500, T0 + 100, T0 + 50, T0 + 40, T0 + 30, T0 + 20])
    monkeypatch.setattr(batch, "now_ms", lambda: next(clock))
    rows = pa.record_batch([pa.array([b"x" * 100] * 4)], names=["value"])
    entries = list(job_write._entries(rows, 200, 1000))
    assert len(entries) == 4
    tops = [batch_time_range(e)[1] for e in entries]
    assert tops == sorted(tops), tops


def untagged_ledger(bk, job_id: str, partition: int, stamps: list[int]) -> int:
    """A task's ledger as an executor of an older pybk wrote it: each entry's header max
    its own batch's, named after the log and the job, and no running-maxima tag."""
    ledger = bk.create_ledger(1, 1, 1, custom_metadata={
        LOG_NAME_KEY: LOG.encode(), JOB_KEY: job_id.encode("ascii")})
    jobs.register_ledger(bk, LOG, job_id, ledger.id, partition, 0)
    for stamp in stamps:
        ledger.add_entry(encode_batch([b"task"], [stamp]))
    ledger.close()
    return ledger.id


def test_a_committed_ledger_without_running_maxima(client, writers):
    """Untagged job ledgers whose last headers are below their records: their maxima
    are read from every header, for the next ledger of the commit and for the segment a
    later writer adds, and their entries are searched one by one (a bisection on their
    headers would pass the first one)."""
    bk = client()
    w = writers(bk)
    append_all(w, [T0 + 100])
    job = jobs.begin_job(bk.metadata, LOG)
    ledgers = [untagged_ledger(bk, job, 0, [T0 + 900, T0 + 200, T0 + 200]),
               untagged_ledger(bk, job, 1, [T0 + 800, T0 + 300])]
    assert commit_job(bk, LOG, job, ledgers).committed
    later = writers(bk)
    append_all(later, [T0 + 1000])
    check_every_target(bk, later)
    befores = [s.max_before for s in live_segments(bk.metadata,
                                                   read_log(bk.metadata, LOG).metadata)]
    assert befores[-2:] == [T0 + 900, T0 + 900]


def test_a_job_ledger_without_running_maxima_ends_the_tail(client, writers):
    """An untagged job ledger (from an older executor) last in the tail, whose segment
    has a known max_before, as a log writer's segment would: the job id keeps it from
    being trusted, and the next writer reads every header of it for the max_before of
    its own segment (its last header alone would put that below the ledger's first
    record, and a search by time would skip it)."""
    bk = client()
    w = writers(bk)
    append_all(w, [T0 + 100])
    job = jobs.begin_job(bk.metadata, LOG)
    ledger = untagged_ledger(bk, job, 0, [T0 + 900, T0 + 200, T0 + 200])
    assert commit_job(bk, LOG, job, [ledger]).committed
    segment = read_log(bk.metadata, LOG).metadata.tail[-1]
    assert (segment.ledger_id, segment.max_before) == (ledger, T0 + 100)
    later = writers(bk)
    append_all(later, [T0 + 1000])
    assert read_log(bk.metadata, LOG).metadata.tail[-1].max_before == T0 + 900
    check_every_target(bk, later)


@pytest.mark.parametrize("metadata, max_before, trusted", [
    ({MAXIMA_KEY: RUNNING_MAXIMA}, None, True),  # tagged, whatever else
    ({LOG_NAME_KEY: b"log", MAXIMA_KEY: RUNNING_MAXIMA, JOB_KEY: b"j"}, 5, True),
    ({LOG_NAME_KEY: b"log"}, NO_TIMESTAMP, True),  # a LogWriter's, before the tag
    ({LOG_NAME_KEY: b"log"}, None, False),  # a LogWriter's, before running maxima
    ({LOG_NAME_KEY: b"log", JOB_KEY: b"j"}, 5, False),  # an older executor's
    ({LOG_NAME_KEY: b"log", JOB_KEY: b"j"}, None, False),  # the same, being committed
    ({LOG_NAME_KEY: b"log", MAXIMA_KEY: b"other"}, None, False),
    ({}, 5, False),  # a caller's own ledger
])
def test_which_ledgers_keep_running_maxima(metadata, max_before, trusted):
    assert keeps_running_maxima(metadata, max_before) is trusted


# -- review of the running-maxima tag --------------------------------------------------------


def count_entry_reads(monkeypatch, ledger_id: int | None = None) -> dict[str, int]:
    """Count the entries read through LedgerHandle (read_entry, and each entry that
    read_entries yields), of ledger ``ledger_id`` only if given."""
    reads = {"entries": 0}
    real_read_entry, real_read_entries = LedgerHandle.read_entry, LedgerHandle.read_entries

    def counted(handle) -> bool:
        return ledger_id is None or handle.id == ledger_id

    def read_entry(handle, *args, **kwargs):
        reads["entries"] += counted(handle)
        return real_read_entry(handle, *args, **kwargs)

    def read_entries(handle, *args, **kwargs):
        for entry in real_read_entries(handle, *args, **kwargs):
            reads["entries"] += counted(handle)
            yield entry

    monkeypatch.setattr(LedgerHandle, "read_entry", read_entry)
    monkeypatch.setattr(LedgerHandle, "read_entries", read_entries)
    return reads


def write_as_main_did(bk, writers, monkeypatch, stamps: list[int]) -> None:
    """Records appended by a LogWriter of pybk before the tag (head format 4, running
    maxima in its headers: max_floor since positions by time came in), one entry each,
    all in one segment: its segments' custom metadata named the log only."""
    with monkeypatch.context() as old:
        old.setattr(writer, "_create_segment_ledger", lambda bk, name, settings, password:
                    bk.create_ledger(1, 1, 1, password=password,
                                     custom_metadata={LOG_NAME_KEY: name.encode()}))
        older = writers(bk, dataclasses.replace(ONE_COPY, segmentMaxBytes=1 << 20))
        append_all(older, stamps, size=10)
        older.close()


def test_a_segment_written_before_the_tag_is_bisected(client, writers, monkeypatch):
    """A segment a LogWriter of pybk before the tag wrote (running maxima, a known
    max_before, untagged) is bisected: a log upgraded from it keeps the logarithmic
    search in its old segments."""
    bk = client()
    w = writers(bk)
    append_all(w, [T0])
    w.close()
    stamps = [T0 + 100 + 10 * i + (7 * i) % 4 for i in range(64)]
    write_as_main_did(bk, writers, monkeypatch, stamps)
    later = writers(bk)
    append_all(later, [T0 + 5000])
    later.close()
    records = list(LogReader(bk, LOG).records())
    reads = count_entry_reads(monkeypatch)
    bound = 2 * math.log2(64) + 8
    for target in (T0 + 101, T0 + 400, T0 + 700):
        reads["entries"] = 0
        assert position_at(bk, LOG, target) == \
            next(r.position for r in records if r.timestamp >= target)
        assert reads["entries"] <= bound, (target, reads)


def test_opening_after_a_segment_written_before_the_tag_reads_one_entry(
        client, writers, monkeypatch):
    """An opening writer reads one entry of a last segment that a LogWriter of pybk
    before the tag wrote (its last header is its running maximum), not all of them (up
    to segmentMaxBytes), at each open while no record follows it."""
    bk = client()
    write_as_main_did(bk, writers, monkeypatch, [T0 + i for i in range(64)])
    segment = read_log(bk.metadata, LOG).metadata.tail[-1]
    assert segment.max_before is not None
    reads = count_entry_reads(monkeypatch, segment.ledger_id)
    for _ in range(3):  # opened and closed without a record: it still ends the tail
        writers(bk).close()  # (the empty segment before is dropped by the next opener)
    assert reads["entries"] <= 3, reads
    monkeypatch.undo()
    check_every_target(bk)


def test_a_commits_retries_read_an_untagged_tail_once(client, writers, monkeypatch):
    """A commit whose CAS loses races reads the last tail segment's largest timestamp
    once: an untagged one is read whole (up to segmentMaxBytes), not once a round."""
    from pybk.errors import BadVersion
    from pybk.log import commit as commit_module
    bk = client()
    w = writers(bk)
    append_all(w, [T0 + 100])
    first = jobs.begin_job(bk.metadata, LOG)
    tail = untagged_ledger(bk, first, 0, [T0 + 900, T0 + 200, T0 + 300, T0 + 250])
    assert commit_job(bk, LOG, first, [tail]).committed
    job = jobs.begin_job(bk.metadata, LOG)
    ledgers = [untagged_ledger(bk, job, 0, [T0 + 950])]
    real_update = commit_module.update_log
    lost = iter(range(3))

    def losing_update(store, metadata, version):
        if next(lost, None) is not None:
            raise BadVersion("another write came first (test)")
        return real_update(store, metadata, version)

    monkeypatch.setattr(commit_module, "update_log", losing_update)
    reads = count_entry_reads(monkeypatch, tail)
    assert commit_job(bk, LOG, job, ledgers).committed
    assert reads["entries"] == 4, reads
    monkeypatch.undo()
    later = writers(bk)
    append_all(later, [T0 + 1000])
    check_every_target(bk, later)


def test_recovery_keeps_the_tag(client, writers):
    """A writer that dies leaves its segment open; the next one's takeover recovers it
    (closing it changes its metadata): the tag stays, and the search still bisects it."""
    bk = client()
    w = writers(bk, ONE_COPY)
    append_all(w, [T0 + 300, T0 + 100, T0 + 200])
    segment = read_log(bk.metadata, LOG).metadata.tail[-1]
    later = writers(client(), ONE_COPY)  # w is fenced, never closed
    metadata = bk.ledger_manager.read(segment.ledger_id).metadata
    assert metadata.state.name == "CLOSED"
    assert metadata.custom_metadata[MAXIMA_KEY] == RUNNING_MAXIMA
    append_all(later, [T0 + 150])
    check_every_target(bk, later)
