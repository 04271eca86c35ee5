"""Logs over ledgers (pybk.log): writers taking over, rolling, truncation, readers, formats.

Real bookies in this process (tests/clientutil.py), E=3, Qw=2, Qa=2, two clients that
stand for two processes.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

import pytest
from clientutil import Cluster

import pybk
from pybk.client import BookKeeper
from pybk.errors import (
    CorruptData,
    InvalidConfiguration,
    LogFenced,
    MalformedMetadata,
    NoSuchLog,
    NotEnoughBookies,
)
from pybk.log import LogReader, LogWriter, Position
from pybk.log.batch import BATCH_HEADER_BYTES, RECORD_OVERHEAD_BYTES, decode_batch, encode_batch
from pybk.log.metadata import Dropped, LogMetadata, Segment, live_segments, read_log, update_log
from pybk.settings import ClientSettings, LogSettings
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(60)

REPLICATED = LogSettings(ensembleSize=3, writeQuorumSize=2, ackQuorumSize=2)
SINGLE_COPY = LogSettings(ensembleSize=1, writeQuorumSize=1, ackQuorumSize=1)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path), 4)
    yield c
    c.close()


@pytest.fixture
def two_bookies(tmp_path):
    c = Cluster(str(tmp_path / "two"), 2)
    yield c
    c.close()


def _quorums(bk: BookKeeper, writer: LogWriter) -> tuple[int, int, int]:
    metadata = bk.ledger_manager.read(writer.metadata.tail[-1].ledger_id).metadata
    return metadata.ensemble_size, metadata.write_quorum_size, metadata.ack_quorum_size


def _open(bk, name="log", **changes) -> LogWriter:
    return LogWriter.open(bk, name, dataclasses.replace(REPLICATED, **changes))


def _segments(bk, name="log") -> list[Segment]:
    """Every segment of the log, in order."""
    return list(live_segments(bk.metadata, read_log(bk.metadata, name).metadata))


def _read_all(bk, name="log", start=None) -> list[tuple[Position, bytes]]:
    return list(LogReader(bk, name, start).read())


def test_a_second_writer_fences_the_first_and_nothing_acknowledged_is_lost(cluster):
    bk1, bk2 = cluster.client(), cluster.client()
    first = _open(bk1)
    acked = [(first.append(b"one-%d" % i), b"one-%d" % i) for i in range(30)]
    in_flight = [first.append_async(b"late-%d" % i) for i in range(30)]
    second = _open(bk2)
    with pytest.raises(LogFenced):
        for _ in range(100):  # in-flight adds may still land before the fence is seen
            first.append(b"after the takeover")
    late = []
    for i, future in enumerate(in_flight):
        try:
            late.append((future.result(timeout=WAIT_S), b"late-%d" % i))
        except LogFenced:
            pass
    mine = [(second.append(b"two-%d" % i), b"two-%d" % i) for i in range(10)]
    second.close()
    records = _read_all(bk2)
    found = dict(records)
    for position, data in acked + late + mine:
        assert found.get(position) == data
    assert [p for p, _ in records] == sorted(p for p, _ in records)
    assert records[-10:] == mine  # the new writer's records come after all the old ones
    assert b"after the takeover" not in found.values()
    first.close()  # harmless after being fenced


def test_writers_racing_to_open_end_with_one_writer(cluster):
    clients = [cluster.client() for _ in range(3)]
    writers: list[LogWriter] = []
    lock = threading.Lock()

    def open_writer(bk) -> None:
        writer = _open(bk, "race")
        with lock:
            writers.append(writer)

    threads = [threading.Thread(target=open_writer, args=(bk,)) for bk in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(writers) == 3
    live = []
    for writer in writers:
        try:
            live.append((writer, writer.append(b"hello from %d" % id(writer))))
        except LogFenced:
            pass
    assert len(live) == 1, "exactly the last writer to open may append"
    writer, position = live[0]
    writer.close()
    assert _read_all(clients[0], "race") == [(position, b"hello from %d" % id(writer))]
    for w in writers:
        w.close()


def test_rolling_closes_segments_and_a_tailing_reader_crosses_them(cluster):
    bk_writer, bk_reader = cluster.client(), cluster.client()
    writer = _open(bk_writer, segmentMaxBytes=2048)
    reader = LogReader(bk_reader, "log")
    got: list = []
    tailing = threading.Thread(target=lambda: got.extend(reader.tail(idle_timeout=3.0)))
    tailing.start()
    written = [(writer.append(b"%04d" % i + bytes(200)), b"%04d" % i + bytes(200))
               for i in range(100)]
    futures = [(writer.append_async(b"async %d" % i), b"async %d" % i) for i in range(200)]
    written += [(f.result(timeout=WAIT_S), data) for f, data in futures]
    tailing.join(timeout=30)
    assert got == written
    segments = _segments(bk_reader)
    assert len(segments) >= 4
    for segment in segments[:-1]:
        assert bk_reader.ledger_manager.read(segment.ledger_id).metadata.state.name == "CLOSED"
    writer.close()


def test_reopening_drops_empty_segments_and_keeps_positions(cluster):
    bk = cluster.client()
    with _open(bk) as writer:
        position = writer.append(b"kept")
    for _ in range(4):
        _open(bk).close()
    metadata = read_log(bk.metadata, "log").metadata
    assert [s.number for s in metadata.tail] == [0, 4]
    assert _read_all(bk) == [(position, b"kept")]
    assert len(bk.list_ledgers()) == 2


def test_truncation_deletes_ledgers_on_the_bookies_and_readers_skip_ahead(cluster):
    bk = cluster.client()
    writer = _open(bk, segmentMaxBytes=1024)
    positions = [writer.append(bytes(100) + b"%d" % i) for i in range(100)]
    # Other readers see the newest record once the writer's explicit LAC reaches the
    # bookies (explicitLacInterval), so it may or may not show up in the reads below.
    last = writer.append(b"the last record")
    reader = LogReader(bk, "log")
    assert reader.read_next(timeout=1)[0] == positions[0]
    cut = positions[60]
    doomed = [s.ledger_id for s in _segments(bk) if s.number < cut.segment]
    assert writer.truncate(cut) == len(doomed) > 0
    assert writer.truncate(positions[10]) == 0  # going back changes nothing
    assert writer.truncate(str(positions[10])) == 0  # its text names the same position
    with pytest.raises(TypeError, match="truncate"):
        writer.truncate(None)
    for ledger_id in doomed:
        assert ledger_id not in bk.list_ledgers()
        assert not any(cluster.holds_ledger(b, ledger_id) for b in cluster.bookie_ids)
    expected = (positions[60:], positions[60:] + [last])
    assert [p for p, _ in reader.read()] in expected  # the old reader jumps ahead
    assert [p for p, _ in _read_all(bk)] in expected
    writer.close()
    assert [p for p, _ in _read_all(bk)] == expected[1]


def test_an_opening_writer_finishes_deletions_a_crash_interrupted(cluster):
    bk = cluster.client()
    with _open(bk) as writer:
        writer.append(b"x")
    orphan = bk.create_ledger(3, 2, 2)
    orphan.close()
    metadata, version = read_log(bk.metadata, "log")
    update_log(bk.metadata, dataclasses.replace(metadata, dropping=(Dropped(None, orphan.id),)),
               version)
    _open(bk).close()
    assert orphan.id not in bk.list_ledgers()
    assert read_log(bk.metadata, "log").metadata.dropping == ()


def test_a_log_replicates_by_default_and_has_one_copy_only_when_asked(cluster, two_bookies):
    bk = cluster.client()
    with LogWriter.open(bk, "default") as writer:
        writer.append(b"replicated")
        assert _quorums(bk, writer) == (3, 2, 2)  # BookKeeper's client defaults
    with LogWriter.open(bk, "single", SINGLE_COPY) as writer:
        writer.append(b"one copy")
        assert _quorums(bk, writer) == (1, 1, 1)
    with pytest.raises(NotEnoughBookies, match="ensembleSize=3.*LogSettings"):
        LogWriter.open(two_bookies.client(), "default")


def test_the_embedded_wal_keeps_one_copy(tmp_path):
    with pybk.open(tmp_path / "wal") as wal:
        wal.append(b"x")
        assert _quorums(wal._bk, wal._writer) == (1, 1, 1)


def test_opening_a_writer_whose_records_cannot_fit_an_entry_names_the_settings(cluster):
    bk = cluster.client(ClientSettings(maxEntrySizeBytes=1 << 20))
    with pytest.raises(InvalidConfiguration,
                       match="recordMaxBytes=2097152.*maxEntrySizeBytes=1048576"):
        _open(bk, recordMaxBytes=2 << 20)
    _open(bk, recordMaxBytes=512 << 10).close()


def test_a_segment_ends_within_a_batch_of_segment_max_bytes_however_slow_rolling_is(cluster):
    """Pipelined appends from three threads while every metadata write takes 50 ms, so
    each roll takes over 100 ms: batches wait for the next segment instead of piling
    onto the full one."""
    bk = cluster.client()
    limit, batch_max = 64 * 1024, 8 * 1024
    writer = _open(bk, segmentMaxBytes=limit, batchMaxBytes=batch_max, maxOutstandingBatches=4)
    written: list[tuple[Position, bytes]] = []
    lock = threading.Lock()

    def append_many(thread: int) -> None:
        futures = [(writer.append_async(b"%d-%d" % (thread, i) + bytes(200)),
                    b"%d-%d" % (thread, i) + bytes(200)) for i in range(1000)]
        acked = [(future.result(timeout=30), data) for future, data in futures]
        with lock:
            written.extend(acked)

    cluster.metadata_faults.delay_s = 0.05
    try:
        threads = [threading.Thread(target=append_many, args=(t,)) for t in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=50)
    finally:
        cluster.metadata_faults.delay_s = 0.0
    writer.close()
    assert len(written) == 3000
    assert sorted(_read_all(bk)) == sorted(written)
    batches: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
    for position, data in written:
        batches[position.segment, position.entry].append(len(data))
    sizes: collections.Counter = collections.Counter()  # bytes the writer counts per segment
    for (segment, _entry), lengths in batches.items():
        sizes[segment] += BATCH_HEADER_BYTES + sum(RECORD_OVERHEAD_BYTES + n for n in lengths)
    segments = sorted(sizes)
    for segment in segments:
        assert sizes[segment] <= limit + batch_max, \
            f"segment {segment} holds {sizes[segment]} bytes; segmentMaxBytes is {limit}"
    assert len(segments) >= 5
    for segment in segments[:-1]:
        assert sizes[segment] >= limit, f"segment {segment} rolled before it was full"


def test_a_segment_older_than_its_age_limit_still_takes_a_batch_before_it_rolls(cluster):
    """With an age limit shorter than a roll, a fresh segment is already old when the
    roll hands it the waiting batches: it must take them, not roll again empty."""
    bk = cluster.client()
    with _open(bk, segmentMaxAgeSeconds=1e-9) as writer:
        written = [(writer.append_async(b"%d" % i), b"%d" % i) for i in range(20)]
        written = [(future.result(timeout=WAIT_S), data) for future, data in written]
    assert _read_all(bk) == written
    assert len(_segments(bk)) <= 21


def test_reading_a_missing_log_is_a_clear_error(cluster):
    with pytest.raises(NoSuchLog, match="nope"):
        _read_all(cluster.client(), "nope")


def test_formats_refuse_foreign_bytes():
    metadata = LogMetadata("x").with_new_segment(7, -1).with_new_segment(9, 5)
    assert LogMetadata.from_bytes(metadata.to_bytes()) == metadata
    assert metadata.tail == (Segment(0, 7, -1), Segment(1, 9, 5))
    with pytest.raises(MalformedMetadata):
        LogMetadata.from_bytes(metadata.to_bytes()[:-1])
    with pytest.raises(ValueError):
        LogMetadata("x", tail=(Segment(3, 1),), next_segment=2)
    assert decode_batch(encode_batch([b"a", b"", b"ccc"])) == [b"a", b"", b"ccc"]
    for bad in (b"", b"\x02\x00\x00\x00\x01", encode_batch([b"abc"])[:-1],
                b"\x01\x00\x00\x00\x00"):
        with pytest.raises(CorruptData):
            decode_batch(bad)
    assert Position.parse(str(Position(1, 2, 3))) == Position(1, 2, 3)
    with pytest.raises(ValueError):
        Position.parse("1:2")


def test_a_log_with_no_segment_reads_nothing_then_the_first_record_appended(cluster):
    """A log whose head exists but which has no segment yet (a job that began on it
    wrote nothing) reads nothing from its start, and a reader tailing from there gets
    the first record a writer appends."""
    bk = cluster.client()
    read_log(bk.metadata, "new", create=True)
    assert _read_all(bk, "new") == []
    with pytest.raises(ValueError, match="past the end"):
        LogReader(bk, "new", Position(0, 0, 1)).read()
    reader = LogReader(bk, "new")
    with _open(bk, "new") as writer:
        position = writer.append(b"first")
        assert reader.read_next(timeout=10) == (position, b"first")
