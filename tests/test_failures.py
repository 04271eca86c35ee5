"""Failures inside the bookie (disk errors, bad callbacks, races with housekeeping) lose
nothing acknowledged, never return wrong bytes, and never wedge the bookie."""

from __future__ import annotations

import errno
import os
import threading
from concurrent.futures import CancelledError

import pytest
from conftest import KEY, entry
from storageutil import JournalWriteFailure

from pybk.errors import BookKeeperError, CorruptData, NoSuchEntry
from pybk.fileio import FileIO
from pybk.storage.entrylog import Location
from pybk.storage.index import Index
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(60)


class FailingLogWrites(FileIO):
    """Fails the next ``failures`` writes to entry logs; ``partial`` writes half first."""

    def __init__(self) -> None:
        self.failures = 0
        self.partial = False

    def write_all(self, fd, buffers):
        if self.failures and os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            self.failures -= 1
            if self.partial:
                data = b"".join(buffers)
                os.write(fd, data[:len(data) // 2])
            raise OSError(errno.EIO, "Input/output error")
        return super().write_all(fd, buffers)


@pytest.mark.parametrize("partial", [False, True], ids=["failed-write", "torn-write"])
def test_failed_checkpoint_keeps_its_entries_for_the_next_one(bookie_factory, settings_factory,
                                                              partial):
    io = FailingLogWrites()
    settings = settings_factory()
    bookie = bookie_factory(settings, io=io)
    for e in range(5):
        bookie.add_entry(1, e, entry(1, e), KEY)
    bookie.fence(1, KEY).result(timeout=WAIT_S)
    bookie.checkpoint()  # the first entry log exists, so a later write can tear inside it
    bookie.add_entry(1, 5, entry(1, 5), KEY, recovery=True)
    io.failures, io.partial = 1, partial
    with pytest.raises(OSError):
        bookie.checkpoint()
    assert bookie.read_entry(1, 5) == entry(1, 5)  # still served from the write cache
    bookie.add_entry(2, 0, entry(2, 0), KEY)
    bookie.checkpoint()  # succeeds, and must not move the mark past the failed generation
    bookie.close()
    reopened = bookie_factory(settings)
    assert reopened.is_fenced(1)
    assert [reopened.read_entry(1, e) for e in range(6)] == [entry(1, e) for e in range(6)]
    assert reopened.read_entry(2, 0) == entry(2, 0)


def test_a_raising_or_cancelled_callback_does_not_stop_the_journal(bookie):
    def bad_callback(_error):
        raise RuntimeError("a bug in the caller")

    bookie.add_entry_async(1, 0, entry(1, 0), KEY, callback=bad_callback)
    cancelled = bookie.add_entry_async(1, 1, entry(1, 1), KEY)
    cancelled.cancel()
    assert bookie.add_entry_async(1, 2, entry(1, 2), KEY).result(timeout=WAIT_S) is None
    bookie.checkpoint()
    assert bookie.entry_ids(1) == [0, 1, 2]
    if cancelled.cancelled():
        with pytest.raises(CancelledError):
            cancelled.result()


@pytest.mark.parametrize("call", ["checkpoint", "close", "delete_ledger"])
def test_blocking_calls_from_a_callback_are_refused_before_acting(bookie, call):
    outcome = {}
    done = threading.Event()

    def callback(_error):
        try:
            if call == "delete_ledger":
                bookie.delete_ledger(1)
            else:
                getattr(bookie, call)()
        except BookKeeperError as e:
            outcome["error"] = e
        done.set()

    bookie.add_entry_async(1, 0, entry(1, 0), KEY, callback=callback)
    assert done.wait(10)
    assert "completion callback" in str(outcome["error"])
    assert bookie.ledger_exists(1) and not bookie.is_closed


def test_operations_refused_by_a_failed_journal_change_nothing(bookie_factory,
                                                               settings_factory):
    io = JournalWriteFailure(errno.EIO)
    settings = settings_factory()
    bookie = bookie_factory(settings, io=io)
    bookie.add_entry(1, 0, entry(1, 0), KEY)
    io.armed = True
    with pytest.raises(BookKeeperError, match="journal write"):
        bookie.add_entry(1, 1, entry(1, 1), KEY)
    with pytest.raises(BookKeeperError, match="journal write"):
        bookie.delete_ledger(1)
    with pytest.raises(BookKeeperError, match="journal write"):
        bookie.fence(1, KEY)
    assert bookie.ledger_exists(1) and not bookie.is_fenced(1)
    bookie.close()
    reopened = bookie_factory(settings)
    assert reopened.read_entry(1, 0) == entry(1, 0)
    assert not reopened.is_fenced(1)


def test_compaction_leaves_logs_a_running_checkpoint_has_not_committed(bookie_factory,
                                                                      settings_factory,
                                                                      monkeypatch):
    bookie = bookie_factory(settings_factory(logSizeLimit=64 << 10, maxEntrySizeBytes=16 << 10,
                                             writeCacheMaxSizeMb=1, gcWaitTime=3_600_000))
    body = b"a" * 4000
    for e in range(10):
        bookie.add_entry(1, e, entry(1, e, body=body), KEY)
    bookie.checkpoint()
    bookie.delete_ledger(1)
    bookie.checkpoint()
    for e in range(10):  # these fill the current log (mostly ledger 1's) and roll it
        bookie.add_entry(3, e, entry(3, e, body=body), KEY)
    inside, go_on = threading.Event(), threading.Event()
    commit = Index.commit_checkpoint

    def paused_commit(self, *args, **kwargs):
        inside.set()
        assert go_on.wait(10)
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(Index, "commit_checkpoint", paused_commit)
    checkpoint = threading.Thread(target=bookie.checkpoint)
    checkpoint.start()
    try:
        assert inside.wait(10)  # entry logs written and synced, the index not yet
        bookie.compact(0.9)
    finally:
        go_on.set()
        checkpoint.join(10)
    monkeypatch.undo()
    assert [bookie.read_entry(3, e) for e in range(10)] == \
        [entry(3, e, body=body) for e in range(10)]


def test_compaction_keeps_a_log_with_a_damaged_record(bookie_factory, settings_factory):
    settings = settings_factory(logSizeLimit=64 << 10, maxEntrySizeBytes=16 << 10,
                                writeCacheMaxSizeMb=1, gcWaitTime=3_600_000)
    bookie = bookie_factory(settings)
    body = b"c" * 1000
    for e in range(10):
        bookie.add_entry(5, e, entry(5, e, body=body), KEY)
    for e in range(40):
        bookie.add_entry(6, e, entry(6, e, body=body), KEY)
    bookie.checkpoint()
    bookie.delete_ledger(6)
    bookie.close()
    bookie = bookie_factory(settings)
    location = bookie._index.location(5, 2)
    with open(bookie._entry_logs._paths[location.log_id], "r+b") as f:
        f.seek(location.offset + 9 + 500)
        f.write(b"X")  # bit rot inside entry 2
    bookie.compact(0.5)
    with pytest.raises(CorruptData):
        bookie.read_entry(5, 2)
    for e in (0, 1, 3, 9):  # the entries after the damage are still there
        assert bookie.read_entry(5, e) == entry(5, e, body=body)


def test_a_stale_location_never_returns_another_entrys_bytes(bookie):
    for e in range(3):
        bookie.add_entry(7, e, entry(7, e, body=b"s" * 500), KEY)
    bookie.checkpoint()
    right = bookie._index.location(7, 1)
    with pytest.raises(CorruptData):  # ask for entry 0 at entry 1's place
        bookie._entry_logs.read(Location(right.log_id, right.offset), right.length, 7, 0)
    with pytest.raises(NoSuchEntry):
        bookie.read_entry(7, 3)
