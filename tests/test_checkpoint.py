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
from pybk.storage.index import Index
from pybk.storage.lastmark import FILE_NAME, read_mark

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
    bookie.fence(1, KEY).result(timeout=10)
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
