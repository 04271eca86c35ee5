"""The checkpoint's ordering: LastLogMark moves only past what entry logs and the index
already hold durably, and not at all once the journal has failed."""

from __future__ import annotations

import errno
import os

import pytest
from conftest import KEY, entry
from storageutil import JournalWriteFailure

from pybk.errors import BookKeeperError
from pybk.fileio import FileIO
from pybk.storage.entrylog import RECORD_HEADER_SIZE, EntryLogger, Location, entry_crc
from pybk.storage.index import Index
from pybk.storage.journal_codec import ADD, RECORD
from pybk.storage.lastmark import FILE_NAME, read_mark
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(60)


class SyncRecorder(FileIO):
    """Appends to ``events`` each sync of an entry log and of a LastLogMark file."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def _record(self, fd: int) -> None:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.endswith(".log"):
            self.events.append("entry log synced")
        elif name.startswith(FILE_NAME):
            self.events.append("lastMark synced")

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        self._record(fd)

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self._record(fd)


def test_lastmark_moves_only_after_entry_logs_and_index_are_durable(bookie_factory,
                                                                     settings_factory,
                                                                     monkeypatch):
    events: list[str] = []
    commit = Index.commit_checkpoint

    def recorded_commit(self, *args, **kwargs):
        commit(self, *args, **kwargs)
        events.append("index committed")

    monkeypatch.setattr(Index, "commit_checkpoint", recorded_commit)
    settings = settings_factory()
    bookie = bookie_factory(settings, io=SyncRecorder(events), start_background_threads=False)
    for e in range(20):
        bookie.add_entry(1, e, entry(1, e), KEY)
    bookie.fence(1, KEY).result(timeout=WAIT_S)
    events.clear()
    mark = bookie.checkpoint()
    first_mark_sync = events.index("lastMark synced")
    assert "entry log synced" in events[:first_mark_sync]
    assert "index committed" in events[:first_mark_sync]
    assert events[first_mark_sync:] == ["lastMark synced"] * len(settings.ledgerDirectories)
    assert read_mark(list(settings.ledgerDirectories)) == mark
    bookie.close()
    # Everything before the mark is in entry logs and the index: nothing left to replay.
    reopened = bookie_factory(settings)
    assert reopened.replayed_records == 0
    assert reopened.is_fenced(1)
    assert [reopened.read_entry(1, e) for e in range(20)] == [entry(1, e) for e in range(20)]


def test_a_checkpoint_after_the_journal_failed_moves_no_mark(bookie_factory, settings_factory):
    io = JournalWriteFailure(errno.EIO)
    settings = settings_factory()
    bookie = bookie_factory(settings, io=io, start_background_threads=False)
    bookie.add_entry(1, 0, entry(1, 0), KEY)
    before = bookie.checkpoint()
    bookie.add_entry(1, 1, entry(1, 1), KEY)
    io.armed = True
    with pytest.raises(BookKeeperError, match="journal write"):
        bookie.add_entry(1, 2, entry(1, 2), KEY)
    assert bookie.checkpoint() is None
    assert read_mark(list(settings.ledgerDirectories)) == before
    bookie.close()
    reopened = bookie_factory(settings)
    assert [reopened.read_entry(1, e) for e in range(2)] == [entry(1, e) for e in range(2)]


def test_one_append_of_many_ledgers_rolls_logs_and_maps_each_ledgers_bytes(tmp_path):
    """append_records: records of many ledgers in one call, across log rolls and
    flushEntrylogBytes steps, land where the placements say, and each log's ledger map
    counts exactly the bytes of each ledger's records it got."""
    directory = tmp_path / "ledgers"
    (directory / "current").mkdir(parents=True)
    logs = EntryLogger([str(directory)], 8192, lambda: str(directory), flush_bytes=3000)
    runs = [(ledger, ledger % 4 + 1) for ledger in range(1, 30)]  # 1 to 4 records each
    records = [(ledger, e, entry(ledger, e, body=bytes([ledger]) * (100 + 37 * e)))
               for ledger, count in runs for e in range(count)]
    buffers = []
    for _ledger, _e, data in records:
        buffers += [RECORD.pack(len(data), entry_crc(data), ADD), data]
    placements = logs.append_records(buffers, runs)
    logs.sync()
    assert len({log_id for log_id, _first, _offsets in placements}) > 1  # it rolled
    expected: dict[int, dict[int, int]] = {}
    placed = 0
    for log_id, first, offsets in placements:
        assert first == placed
        for (ledger, e, data), offset in zip(records[first:], offsets):
            assert logs.read(Location(log_id, offset), len(data), ledger, e) == data
            per_log = expected.setdefault(log_id, {})
            per_log[ledger] = per_log.get(ledger, 0) + RECORD_HEADER_SIZE + len(data)
        placed += len(offsets)
    assert placed == len(records)
    assert {log_id: logs.ledger_maps[log_id] for log_id in expected} == expected
    logs.close()
