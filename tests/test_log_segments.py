"""Logs of any length (format 2 of pybk.log.metadata): a head of constant size, one
record per segment number; logs past format 1's wall; format-1 logs read and converted;
writers dying between the steps.

Big logs are built cheaply by writing their records straight into a closed embedded
store (tests/segmentutil.py); the rest runs on real bookies in this process
(tests/clientutil.py) or a real WAL directory.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import threading
import time

import pytest
import zkutil
from clientutil import FAST, Cluster
from segmentutil import Forge, forge_format_1, forge_segments, format_1_record

import pybk
from pybk.client import BookKeeper
from pybk.client.transport import InProcessBookieClient
from pybk.errors import BookKeeperError, LogFenced, MetadataUnavailable
from pybk.log import LogReader, LogWriter, Position, promotion
from pybk.log.batch import encode_batch
from pybk.log.metadata import (
    FORMAT_VERSION,
    TAIL_SEGMENTS,
    LogMetadata,
    Segment,
    delete_log,
    ensure_records,
    find_segment,
    live_segments,
    log_path,
    mark_dead,
    read_log,
    read_segment,
    segment_path,
    segments_path,
    store_records,
    update_log,
)
from pybk.log.ranges import plan as plan_ranges
from pybk.meta import MAX_DATA_BYTES, interface
from pybk.meta.embedded import EmbeddedMetadataStore
from pybk.meta.zookeeper import ZooKeeperMetadataStore
from pybk.settings import LogSettings
from pybk.testing.faulty_metadata import FaultyMetadataStore

pytestmark = pytest.mark.timeout(240)

ONE_COPY = LogSettings(ensembleSize=1, writeQuorumSize=1, ackQuorumSize=1)
SMALL_SEGMENTS = dataclasses.replace(ONE_COPY, segmentMaxBytes=256)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path), 1)
    yield c
    c.close()


@pytest.fixture
def open_writer(cluster):
    """Opens writers of log "log" with SMALL_SEGMENTS, closed at the end of the test
    (also when it fails).  Closing a writer that another one fenced may fail (its last
    segment was recovered, or dropped and deleted): not what these tests look at."""
    opened: list[LogWriter] = []

    def open_(bk) -> LogWriter:
        writer = LogWriter.open(bk, "log", SMALL_SEGMENTS)
        opened.append(writer)
        return writer

    yield open_
    for writer in opened:
        _close_quietly(writer)


def _close_quietly(writer: LogWriter) -> None:
    with contextlib.suppress(BookKeeperError):
        writer.close()


def _head(bk, name="log") -> LogMetadata:
    return read_log(bk.metadata, name).metadata


def _head_bytes(store, name) -> int:
    return len(store.get(log_path(name))[0])


def _roll(writer: LogWriter, times: int) -> list[tuple[Position, bytes]]:
    """Append records filling ``times`` segments of SMALL_SEGMENTS: so many rolls."""
    written = []
    for i in range(times):
        data = b"roll %d " % i + bytes(300)
        written.append((writer.append(data), data))
    return written


def _read(bk, start=None, writer=None) -> list[tuple[Position, bytes]]:
    """The log's records from ``start``; with the writer, up to its newest."""
    return list(LogReader(bk, "log", start, writer=writer).read())


# -- past the wall ----------------------------------------------------------------------


def test_a_wal_with_more_segments_than_format_1_could_hold_opens_rolls_reads_truncates(
        tmp_path):
    """40,000 segments (format 1's record held about 34,400): the head stays a few
    hundred bytes, and the WAL opens, rolls, appends, reads across every segment from
    the start, truncates and opens again."""
    directory = tmp_path / "wal"
    with pybk.open(directory) as wal:
        first = wal.append(b"first")
        bookie_id = wal.bookie_id
    forged = forge_segments(str(directory / "metadata"), "wal", 40_000, bookie_id)
    assert forged.next_segment == 40_001

    with pybk.open(directory, segmentMaxBytes=256) as wal:
        store = wal._bk.metadata
        written = [(first, b"first")]
        for i in range(6):  # every append after the first of a segment rolls
            data = b"after %d " % i + bytes(300)
            written.append((wal.append(data), data))
        assert written[-1][0].segment > 40_000 + 5
        assert _head_bytes(store, "wal") < 1024
        assert len(wal._writer.metadata.tail) == TAIL_SEGMENTS
        assert list(wal.read()) == written  # across 40,000 empty segments below the tail
        assert list(wal.read(Position(39_990, 0, 0))) == written[1:]
        # Truncation deletes the ledgers and records of 1,000 segments, and only those.
        cut = Position(1_000, 0, 0)
        assert wal._writer.truncate(cut) == 1_000  # segment 0 and 999 forged ones
        head = _head(wal._bk, "wal")
        assert head.truncated_before == cut and head.oldest_segment == 1_000
        assert read_segment(store, "wal", 999) is None
        assert read_segment(store, "wal", 1_000).ledger_id is not None
        assert forged.tail[0].ledger_id in wal._bk.list_ledgers()
        assert list(wal.read()) == written[1:]
    with pybk.open(directory) as wal:
        assert list(wal.read(Position(39_999, 0, 0))) == written[1:]
        last = wal.append(b"last")
        assert list(wal.read(written[-1][0])) == [written[-1], (last, b"last")]


def test_a_format_1_log_at_the_wall_opens_converted_and_takes_appends(tmp_path):
    """A format-1 record one segment short of MAX_DATA_BYTES (a roll or an open there
    raised MetadataError and the WAL could neither be written nor reopened): the WAL
    opens, converting it, and every record stays readable."""
    directory = tmp_path / "wal"
    with pybk.open(directory) as wal:
        before = [(wal.append(b"before %d" % i), b"before %d" % i) for i in range(3)]
        segment = wal._writer.metadata.tail[-1]
        bookie_id = wal.bookie_id
    record = forge_format_1(str(directory / "metadata"), "wal", [segment], bookie_id,
                            MAX_DATA_BYTES)
    head = LogMetadata.from_bytes(record)
    # How many segments fit depends on the digits of the ledger ids (a new embedded
    # store's ids start at a random point): about 33,000 to 36,000.
    assert head.format_version == 1 and len(head.tail) > 30_000
    next_one = Segment(head.next_segment, head.tail[-1].ledger_id + 1)
    one_more = format_1_record("wal", list(head.tail) + [next_one], head.next_segment + 1)
    assert len(one_more) > MAX_DATA_BYTES  # the next segment did not fit: the wall

    with pybk.open(directory) as wal:
        head = _head(wal._bk, "wal")
        assert head.format_version == FORMAT_VERSION and len(head.tail) <= TAIL_SEGMENTS
        assert _head_bytes(wal._bk.metadata, "wal") < 1024
        after = [(wal.append(b"after %d" % i), b"after %d" % i) for i in range(3)]
        assert after[0][0].segment > 30_000
        assert list(wal.read()) == before + after
        assert sum(1 for _ in live_segments(wal._bk.metadata, head)) == len(
            LogMetadata.from_bytes(record).tail) + 1 - 2  # the new one; the last two dropped


def test_the_layout_and_its_compare_and_set_work_the_same_on_zookeeper(zookeeper, bookie):
    """Rolls past the tail, reads across segment records, truncation, and the head's
    CAS fencing a second writer, on a real ZooKeeper."""
    with ZooKeeperMetadataStore(zkutil.formatted_cluster(zookeeper), zkutil.settings()) \
            as store, contextlib.ExitStack() as stack:
        clients = [stack.enter_context(BookKeeper(store, {"B1": InProcessBookieClient(
            "B1", bookie)}, FAST)) for _ in range(2)]
        first = LogWriter.open(clients[0], "log", SMALL_SEGMENTS)
        stack.callback(_close_quietly, first)
        written = _roll(first, 8)
        head = read_log(store, "log").metadata
        assert len(head.tail) == TAIL_SEGMENTS and head.tail[0].number > 3
        numbers = [s.number for s in live_segments(store, head)]
        assert numbers == list(range(len(numbers))) and len(numbers) >= 8
        assert _read(clients[1], writer=first) == written
        assert first.truncate(written[3][0]) == 3
        assert read_segment(store, "log", 2) is None
        second = LogWriter.open(clients[1], "log", SMALL_SEGMENTS)
        stack.callback(_close_quietly, second)
        with pytest.raises(LogFenced):
            first.truncate(written[5][0])
        late = second.append(b"late")
        assert _read(clients[1], writer=second) == written[3:] + [(late, b"late")]


# -- format 1 ---------------------------------------------------------------------------


def _filled_ledger(bk, records: list[bytes]) -> int:
    ledger = bk.create_ledger(1, 1, 1)
    ledger.add_entry(encode_batch(records))
    ledger.close()
    return ledger.id


def test_a_format_1_log_is_read_as_it_is_and_converted_by_its_next_writer(cluster,
                                                                          open_writer):
    """Segments 0, 2 and 5 (1, 3 and 4 dropped empty by earlier writers): readers read
    the format-1 record as it is; the writer that opens it writes a record per segment
    and a hollow dead record at each gap; reads and truncation go on across them."""
    bk = cluster.client()
    segments = [Segment(n, _filled_ledger(bk, [b"segment %d" % n])) for n in (0, 2, 5)]
    bk.metadata.create(log_path("log"), format_1_record("log", segments, 7))
    expected = [(Position(n, 0, 0), b"segment %d" % n) for n in (0, 2, 5)]
    assert _read(bk) == expected
    assert _read(bk, Position(1, 0, 0)) == expected[1:]
    assert not bk.metadata.exists(segments_path("log"))  # reading changed nothing

    writer = open_writer(bk)
    head = _head(bk)
    assert head.format_version == FORMAT_VERSION
    assert [s.number for s in head.tail] == [0, 2, 5, 7]
    for number, skip_to in ((1, 2), (3, 5), (6, 7)):
        dead = read_segment(bk.metadata, "log", number)
        assert (dead.ledger_id, dead.skip_to, dead.hollow) == (None, skip_to, True)
    written = expected + _roll(writer, 5)  # 0, 2 and 5 leave the tail
    assert 5 not in [s.number for s in _head(bk).tail]
    assert _read(bk, writer=writer) == written
    assert _read(bk, Position(3, 0, 0), writer) == written[2:]
    assert writer.truncate(Position(5, 0, 0)) == 2
    assert [read_segment(bk.metadata, "log", n) for n in range(5)] == [None] * 5
    assert segments[0].ledger_id not in bk.list_ledgers()
    assert _read(bk, writer=writer) == written[2:]


@pytest.mark.parametrize("kind", ["embedded", "zookeeper"])
def test_a_format_1_conversion_writes_records_in_batches_and_resumes_after_a_crash(
        request, tmp_path, monkeypatch, kind):
    """Converting a format-1 log writes its segment records in batches of
    MAX_BATCH_RECORDS (cut to 50 here), never one create per record; an opener that died
    after some batches (their records, and one of the next batch's) leaves a state that
    the next conversion completes, record by record only where records are there."""
    monkeypatch.setattr(interface, "MAX_BATCH_RECORDS", 50)
    if kind == "zookeeper":
        store = ZooKeeperMetadataStore(
            zkutil.formatted_cluster(request.getfixturevalue("zookeeper")), zkutil.settings())
    else:
        store = EmbeddedMetadataStore(tmp_path / "metadata")
    with store:
        segments = [Segment(n, 1_000 + n) for n in range(0, 300, 3)]  # 2 dead numbers after each
        head = LogMetadata("log", tuple(segments), 301, format_version=1)
        expected = {n: (1_000 + n, None, False) if n % 3 == 0 else (None, n + 2, True)
                    for n in range(298) if n % 3 != 2}
        expected[298] = (None, 301, True)  # the run after the last segment
        calls: collections.Counter[str] = collections.Counter()
        for method in ("create", "create_many"):
            monkeypatch.setattr(store, method, _counted(calls, method, getattr(store, method)))

        # The opener that died: the records of 40 segments (80: one batch and 30 more),
        # then the head CAS never came.
        store_records(store, "log", segments[:40], 0, hollow=True)
        assert calls == {"create_many": 2}
        ensure_records(store, head)
        assert calls["create_many"] == 2 + 4  # 200 records: 4 batches
        # Record by record (at most a create each) only the 2 batches that met the dead
        # opener's records, never the other 2.
        assert calls["create"] <= 2 * 50
        found = {n: read_segment(store, "log", n) for n in range(301)}
        assert {n: (r.ledger_id, r.skip_to, r.hollow) for n, r in found.items()
                if r is not None} == expected
        assert list(live_segments(store, dataclasses.replace(head, format_version=3,
                                                               tail=()))) == segments


def _counted(calls, name, method):
    def counting(*args, **kwargs):
        calls[name] += 1
        return method(*args, **kwargs)
    return counting


# -- demotion ---------------------------------------------------------------------------


@pytest.mark.parametrize("format_version", [1, 2])
def test_a_demoted_log_reads_and_truncates_across_its_numbering_jump(tmp_path,
                                                                     format_version):
    """Demotion (pybk.log.promotion.demote) drops the leading segments the WAL's bookie
    no longer holds and makes the next segment number jump by 2^32: the next writer
    deletes what was dropped, and a truncation past the jump walks over it in one step
    (a hollow dead record), whether the log was in format 1 or 2."""
    directory = tmp_path / "wal"
    with pybk.open(directory, segmentMaxBytes=256) as wal:
        written = [(wal.append(b"%d " % i + bytes(300)), b"%d " % i + bytes(300))
                   for i in range(6)]
    with EmbeddedMetadataStore(directory / "metadata") as store:
        head = read_log(store, "wal").metadata
        segments = list(live_segments(store, head))
    if format_version == 1:
        with Forge(str(directory / "metadata")) as forge:
            forge.delete_children(segments_path("wal"))
            forge.put(log_path("wal"), format_1_record("wal", segments, head.next_segment))
    gone = {s.ledger_id for s in segments[:2]}  # as if the cluster had truncated them
    with EmbeddedMetadataStore(directory / "metadata") as store:
        store.create(promotion.PROMOTED, b"zk://127.0.0.1:1/ledgers")
        demoted = promotion.demote(store, lambda ledger_id: ledger_id not in gone, "wal",
                                   str(directory))
    assert (demoted.segments_kept, demoted.segments_dropped) == (len(segments) - 2, 2)
    kept = [r for r in written if r[0].segment >= segments[2].number]
    with pybk.open(directory) as wal:
        assert list(wal.read()) == kept
        later = wal.append(b"embedded again")
        assert later.segment >= head.next_segment + promotion.SEGMENT_GAP_AFTER_DEMOTION
        assert not gone & set(wal._bk.list_ledgers())  # deleted by the writer that opened
        wal.truncate(later)
        assert list(wal.read()) == [(later, b"embedded again")]
        assert not {s.ledger_id for s in segments} & set(wal._bk.list_ledgers())
        assert read_segment(wal._bk.metadata, "wal", head.next_segment) is None


# -- restarts without writes ---------------------------------------------------------------


def test_restarts_without_writes_leave_one_run_that_readers_cross_in_one_read(
        cluster, open_writer, monkeypatch):
    """Every open starts a segment; a restart that writes nothing drops it at the next
    open.  The head keeps the segment before them (the tail's first), so the numbers
    they used make one run with one dead record at its start: after 30 restarts a reader
    leaving segment 0 reads two segment records, not 30."""
    bk = cluster.client()
    written = [(open_writer(bk).append(b"kept"), b"kept")]
    for _ in range(30):
        open_writer(bk)
    assert [s.number for s in _head(bk).tail] == [0, 30]
    assert len(bk.list_ledgers()) == 2  # the dropped segments' ledgers are deleted
    writer = open_writer(bk)
    written += _roll(writer, 5)  # in segments 31 to 35
    assert _head(bk).tail[0].number > 31  # the run is below the tail now
    run = read_segment(bk.metadata, "log", 1)
    assert (run.ledger_id, run.skip_to) == (None, 31)

    store = bk.metadata
    record_reads = []
    real_get = store.get

    def counting_get(path):
        if path.startswith(segments_path("log")):
            record_reads.append(path)
        return real_get(path)

    monkeypatch.setattr(store, "get", counting_get)
    reader = LogReader(bk, "log", writer=writer)
    assert reader.read_next(timeout=1) == written[0]
    record_reads.clear()
    assert reader.read_next(timeout=1) == written[1]  # segment 31, past the run
    assert record_reads == [segment_path("log", 1), segment_path("log", 31)]


# -- writers dying between the steps ----------------------------------------------------------


def _release_others(faults, keep, until: threading.Thread, timeout_s: float = 30.0) -> None:
    """Let every held metadata write but ``keep`` land until ``until`` ends."""
    deadline = time.monotonic() + timeout_s
    while until.is_alive() and time.monotonic() < deadline:
        for write in faults.held():
            if write is not keep:
                faults.release(write)
        until.join(timeout=0.01)
    assert not until.is_alive(), "the other writer did not finish opening"


def _in_thread(function) -> tuple[threading.Thread, list]:
    """Run ``function`` in a thread; the list gets its result."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(function()), daemon=True)
    thread.start()
    return thread, result


def test_a_writer_stopped_after_its_cas_before_its_segment_record_is_repaired(
        cluster, open_writer):
    """The first writer of a log stops after the CAS that added segment 0 and before
    writing its record.  The next writer writes it (segment 0, the tail's first, is
    kept although empty); once rolls push it out of the tail, reads go across it and
    truncation deletes its ledger through the record."""
    bk1, bk2 = cluster.client(), cluster.client()
    faults = cluster.metadata_faults
    faults.prefix = segments_path("log")
    faults.hold_writes = True
    first, _ = _in_thread(lambda: open_writer(bk1))
    [stalled] = faults.wait_held(1)
    head = _head(bk2)
    assert [s.number for s in head.tail] == [0] and read_segment(bk2.metadata, "log", 0) is None
    segment_0 = head.tail[0]

    second, opened = _in_thread(lambda: open_writer(bk2))
    _release_others(faults, stalled, second)
    writer = opened[0]
    assert read_segment(bk2.metadata, "log", 0).ledger_id == segment_0.ledger_id
    faults.hold_writes = False
    faults.release(stalled)  # it lands late: the record is there, and says the same
    first.join(timeout=10)
    written = _roll(writer, 5)
    assert segment_0 not in _head(bk2).tail
    assert _read(bk2, writer=writer) == written
    assert writer.truncate(written[-1][0]) >= 1
    assert segment_0.ledger_id not in bk2.list_ledgers()


def test_a_dropped_segment_stays_dropped_when_its_stalled_writer_writes_its_record_late(
        cluster, open_writer):
    """A writer stalls after the CAS of a roll, before the new segment's record.  A
    second writer opens, finds that segment empty and drops it (a dead record).  The
    stalled write then lands: the dead record wins, so a reader that later looks for the
    segment by number below the tail skips it instead of opening its deleted ledger."""
    bk1, bk2 = cluster.client(), cluster.client()
    writer1 = open_writer(bk1)
    faults = cluster.metadata_faults
    faults.prefix = segments_path("log")
    faults.hold_writes = True
    written = [(writer1.append(bytes(300)), bytes(300))]  # full: it rolls at once
    [stalled] = faults.wait_held(1)
    dropped = _head(bk2).tail[-1]
    assert stalled.path == segment_path("log", dropped.number)

    second, opened = _in_thread(lambda: open_writer(bk2))
    _release_others(faults, stalled, second)
    writer2 = opened[0]
    assert dropped not in _head(bk2).tail
    assert dropped.ledger_id not in bk2.list_ledgers()
    faults.hold_writes = False
    faults.release(stalled)
    record = read_segment(bk2.metadata, "log", dropped.number)
    assert record.ledger_id is None, "the late write brought the dropped segment back"
    with pytest.raises(LogFenced):  # whichever of its roll's steps finds out first
        writer1.append(b"after the takeover")
    written += _roll(writer2, 5)
    assert dropped.number < _head(bk2).tail[0].number
    assert find_segment(bk2.metadata, _head(bk2), dropped.number).number > dropped.number
    assert _read(bk2, writer=writer2) == written


def test_a_truncation_interrupted_half_way_is_finished_by_the_next_writer(
        cluster, open_writer, monkeypatch):
    bk1, bk2 = cluster.client(), cluster.client()
    writer = open_writer(bk1)
    written = _roll(writer, 12)
    cut = written[10][0]
    segments = [s for s in live_segments(bk1.metadata, _head(bk1)) if s.number < cut.segment]
    deleted = []
    real_delete = bk1.delete_ledger

    def dies_after_three(ledger_id):
        if len(deleted) == 3:
            raise MetadataUnavailable("the writer's process died here")
        real_delete(ledger_id)
        deleted.append(ledger_id)

    monkeypatch.setattr(bk1, "delete_ledger", dies_after_three)
    with pytest.raises(MetadataUnavailable):
        writer.truncate(cut)
    head = _head(bk2)
    assert head.truncated_before == cut and head.oldest_segment == 0
    assert _read(bk2, writer=writer) == written[10:]  # readers see the cut at once
    assert len(set(bk2.list_ledgers()) & {s.ledger_id for s in segments}) == \
        len(segments) - 3

    second = open_writer(bk2)
    head = _head(bk2)
    assert head.oldest_segment == cut.segment
    assert not set(bk2.list_ledgers()) & {s.ledger_id for s in segments}
    assert all(read_segment(bk2.metadata, "log", n) is None for n in range(cut.segment))
    late = second.append(b"late")
    assert _read(bk2, writer=second) == written[10:] + [(late, b"late")]


def test_the_head_cas_fences_a_writer_that_truncates_or_rolls_after_another_opened(
        cluster, open_writer):
    bk1, bk2 = cluster.client(), cluster.client()
    first = open_writer(bk1)
    written = _roll(first, 3)
    second = open_writer(bk2)
    with pytest.raises(LogFenced):
        first.truncate(written[2][0])
    assert _head(bk2).truncated_before == Position(0, 0, 0)
    with pytest.raises(LogFenced):
        _roll(first, 2)
    mine = _roll(second, 2)
    assert _read(bk2, writer=second) == written + mine


# -- a truncation across a hollow run, stopped at every step ----------------------------------

#: What finishing the walk below may cost, in metadata calls on the log's records: its
#: log has about a dozen records (3 segments, a dead record, a demotion's hollow record,
#: 7 segments past the jump), and an opener reads or writes each a few times (twice
#: over if its own walk recorded progress and it opens again).  Stepping through the
#: 2^32 numbers of the hollow run one by one goes past it at once.
FINISH_CALLS_MAX = 200


def _store_of(request, tmp_path, kind: str):
    """A real metadata store of ``kind``: embedded under tmp_path, or a cluster of its
    own on the session's ZooKeeper."""
    if kind == "zookeeper":
        return ZooKeeperMetadataStore(
            zkutil.formatted_cluster(request.getfixturevalue("zookeeper")), zkutil.settings())
    return EmbeddedMetadataStore(tmp_path / "metadata")


def _fails_at_write(index: int, failed: list[str]):
    """A FaultyMetadataStore.fail_when that fails write ``index`` (0: the first) and
    appends its path to ``failed``."""
    counter = itertools.count()

    def fails(_operation: str, path: str) -> bool:
        if next(counter) != index:
            return False
        failed.append(path)
        return True

    return fails


def _demoted_and_written(bk, name: str) -> tuple[list[tuple[Position, bytes]], int]:
    """Log ``name`` as demotion leaves it (a hollow dead record at the number the next
    segment would have had, and the next number 2^32 later) with segments written on
    both sides of the jump; its records and the first number of the jump."""
    with LogWriter.open(bk, name, SMALL_SEGMENTS) as writer:
        written = _roll(writer, 3)                  # segments 0, 1, 2; 3 empty
    head, version = read_log(bk.metadata, name)
    jump = head.next_segment
    mark_dead(bk.metadata, name, jump, jump + promotion.SEGMENT_GAP_AFTER_DEMOTION,
              hollow=True)
    update_log(bk.metadata, dataclasses.replace(
        head, next_segment=jump + promotion.SEGMENT_GAP_AFTER_DEMOTION), version)
    with LogWriter.open(bk, name, SMALL_SEGMENTS) as writer:   # drops 3
        written += _roll(writer, 6)                 # past the jump
    assert written[3][0].segment == jump + promotion.SEGMENT_GAP_AFTER_DEMOTION
    return written, jump


@pytest.mark.parametrize("finisher", ["opener", "truncate"])
@pytest.mark.parametrize("kind", ["embedded", "zookeeper"])
def test_a_truncation_across_a_hollow_run_stopped_at_any_step_is_finished_within_a_bound(
        request, tmp_path, bookie, kind, finisher):
    """A truncation past a demotion's jump of 2^32 segment numbers, stopped at each of
    its metadata writes in turn (the write fails, as a process that dies there leaves
    it): the next writer that opens the log, or the same writer truncating again,
    finishes the walk in at most FINISH_CALLS_MAX metadata calls on the log's records
    (never one step per number of the jump); the log then reads the records from the
    cut on and nothing else, every segment record and ledger before the cut is gone, and
    the head's numbers say so."""
    with _store_of(request, tmp_path, kind) as real, contextlib.ExitStack() as stack:
        store = FaultyMetadataStore(real)
        bk = stack.enter_context(BookKeeper(store, {"B1": InProcessBookieClient(
            "B1", bookie)}, FAST))
        stop = 0
        while True:  # stop at write 0, 1, 2, ... until the truncation has none left
            name = f"cut-{stop:02d}"
            written, jump = _demoted_and_written(bk, name)
            cut = written[5][0]  # the third segment past the jump
            before = {n: read_segment(store, name, n) for n in (*range(jump + 1),
                      *range(written[3][0].segment, cut.segment))}
            writer = LogWriter.open(bk, name, SMALL_SEGMENTS)
            stack.callback(_close_quietly, writer)
            store.prefix, failed = log_path(name), []
            store.fail_when = _fails_at_write(stop, failed)
            try:
                writer.truncate(cut)
                finished = True
            except MetadataUnavailable:
                finished = False
            store.fail_when = None
            store.calls, store.calls_max = 0, FINISH_CALLS_MAX
            if finisher == "opener":
                writer = LogWriter.open(bk, name, SMALL_SEGMENTS)
                stack.callback(_close_quietly, writer)
            writer.truncate(cut)  # after an opener: only if the first write failed
            store.calls_max = None
            head = read_log(store, name).metadata
            assert head.truncated_before == cut, f"stopped at write {stop}"
            assert head.oldest_segment == cut.segment, f"stopped at write {stop}"
            assert head.next_segment == writer.metadata.tail[-1].number + 1
            assert [n for n in before if read_segment(store, name, n) is not None] == [], \
                f"stopped at write {stop} ({failed})"
            gone = {r.ledger_id for r in before.values() if r and r.ledger_id is not None}
            assert not gone & set(bk.list_ledgers()), f"stopped at write {stop}"
            assert list(LogReader(bk, name, writer=writer).read()) == written[5:]
            if finished:
                break
            stop += 1
        assert stop > 8  # every delete and CAS of the walk


@pytest.mark.parametrize("kind", ["embedded", "zookeeper"])
def test_a_position_inside_a_hollow_run_is_found_without_stepping_through_it(
        request, tmp_path, bookie, kind):
    """A reader, a range plan and a truncation given a position inside a demotion's jump
    (a number no record names) go on at the first segment after the jump in at most
    FINISH_CALLS_MAX metadata calls on the log's records: from the record before it,
    not one number at a time."""
    with _store_of(request, tmp_path, kind) as real, contextlib.ExitStack() as stack:
        store = FaultyMetadataStore(real)
        bk = stack.enter_context(BookKeeper(store, {"B1": InProcessBookieClient(
            "B1", bookie)}, FAST))
        written, jump = _demoted_and_written(bk, "log")
        inside = Position(jump + 1000, 0, 0)
        writer = LogWriter.open(bk, "log", SMALL_SEGMENTS)
        stack.callback(_close_quietly, writer)
        store.prefix, store.calls_max = log_path("log"), FINISH_CALLS_MAX
        assert find_segment(store, _head(bk), inside.segment).number == written[3][0].segment
        assert list(LogReader(bk, "log", inside, writer=writer).read()) == written[3:]
        assert [r.start for r in plan_ranges(bk, "log", inside).ranges][:1] == [written[3][0]]
        assert writer.truncate(inside) == 3
        assert _head(bk).truncated_before == written[3][0]
        store.calls_max = None
        assert list(LogReader(bk, "log", writer=writer).read()) == written[3:]


@pytest.mark.parametrize("kind", ["embedded", "zookeeper"])
def test_a_truncation_walk_that_another_walk_passes_a_hollow_run_under_stays_bounded(
        request, tmp_path, bookie, kind):
    """Two walks at once: a writer truncates past a demotion's jump, and while its walk
    deletes its first record (it read oldest_segment before), another writer opens the
    log, walks the same records and passes the hollow run (its record deleted with the
    head's CAS of oldest_segment).  The first walk then finds the hollow record gone:
    it must go on where the stored oldest_segment says, not step through the 2^32
    numbers of the run (it ends within FINISH_CALLS_MAX calls, fenced by the opener)."""
    with _store_of(request, tmp_path, kind) as real, contextlib.ExitStack() as stack:
        store = FaultyMetadataStore(real)
        bk = stack.enter_context(BookKeeper(store, {"B1": InProcessBookieClient(
            "B1", bookie)}, FAST))
        written, jump = _demoted_and_written(bk, "log")
        cut = written[5][0]  # the third segment past the jump
        writer = LogWriter.open(bk, "log", SMALL_SEGMENTS)
        stack.callback(_close_quietly, writer)
        opened: list[LogWriter] = []
        opening = []

        def another_writer_opens_at_the_first_delete(operation: str, path: str) -> bool:
            if operation == "delete" and path.startswith(segments_path("log")) \
                    and not opening:
                opening.append(True)  # once: the opener's own deletes pass
                opened.append(LogWriter.open(bk, "log", SMALL_SEGMENTS))
                stack.callback(_close_quietly, opened[0])
                store.calls = 0  # from here on: the first walk's calls
            return False

        store.prefix = log_path("log")
        store.fail_when = another_writer_opens_at_the_first_delete
        store.calls_max = FINISH_CALLS_MAX
        try:
            writer.truncate(cut)
        except LogFenced:
            pass  # the opener took the log over: the walk ended, and no further
        finally:
            store.fail_when = store.calls_max = None
        assert opened, "the other writer did not open during the walk"
        head = read_log(store, "log").metadata
        assert head.oldest_segment > jump, head
        assert read_segment(store, "log", jump) is None


def test_a_record_a_fenced_writer_writes_below_the_truncation_goes_with_the_log(
        tmp_path, bookie):
    """A writer's roll CAS lands, and its write of the new segment's record is slow.
    Meanwhile another writer opens (dropping that empty segment) and truncates past it:
    the walk deletes the record.  Then the slow write lands: a record below
    oldest_segment, where no walk looks.  Deleting the log must still delete it (and the
    log), not fail for good because the segments' parent still has a child."""
    with EmbeddedMetadataStore(tmp_path / "metadata") as real, \
            contextlib.ExitStack() as stack:
        store = FaultyMetadataStore(real)
        bk = stack.enter_context(BookKeeper(store, {"B1": InProcessBookieClient(
            "B1", bookie)}, FAST))
        first = LogWriter.open(bk, "log", SMALL_SEGMENTS)
        stack.callback(_close_quietly, first)
        store.prefix, store.hold_writes = segment_path("log", 1), True
        stack.callback(store.release_all)
        first.append(b"0" + bytes(300))
        first.append_async(b"1" + bytes(300))  # rolls to segment 1: its record is held
        (late,) = store.wait_held(1)
        assert late.operation == "create", late
        store.hold_writes = False  # the other writer's writes of that record go through
        second = LogWriter.open(bk, "log", SMALL_SEGMENTS)
        stack.callback(_close_quietly, second)
        assert 1 not in [s.number for s in second.metadata.tail], second.metadata
        written = _roll(second, 2)
        second.truncate(written[-1][0])
        assert read_log(store, "log").metadata.oldest_segment > 1
        assert read_segment(store, "log", 1) is None
        store.release(late)
        assert read_segment(store, "log", 1) is not None, "the late write did not land"
        second.close()
        delete_log(store, "log")
        assert not store.exists(log_path("log")) and not store.exists(segments_path("log"))
