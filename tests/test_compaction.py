"""Garbage collection and compaction reclaim space and keep every live entry readable,
also across a crash in the middle of compaction."""

from __future__ import annotations

import glob
import os
import time

import pytest
from conftest import KEY, entry

from pybk.storage.gc import GarbageCollector
from pybk.storage.index import Index

pytestmark = pytest.mark.timeout(120)

BODY = b"c" * 20_000
LEDGERS = range(1, 11)


def _settings(settings_factory):
    # Small entry logs so that interleaved ledgers spread over many of them; no automatic
    # GC or compaction, so each test decides when they run.
    return settings_factory(logSizeLimit=512 << 10, maxEntrySizeBytes=64 << 10,
                            writeCacheMaxSizeMb=1, gcWaitTime=3_600_000,
                            minorCompactionInterval=0, majorCompactionInterval=0)


def _fill(bookie, entries_per_ledger=40):
    """Interleave ten ledgers, checkpointing often so every entry log holds several."""
    for e in range(entries_per_ledger):
        for ledger in LEDGERS:
            bookie.add_entry(ledger, e, entry(ledger, e, body=BODY), KEY)
        if e % 5 == 4:
            bookie.checkpoint()
    bookie.checkpoint()


def _log_bytes(bookie):
    return sum(os.path.getsize(p) for d in bookie.settings.ledgerDirectories
               for p in glob.glob(os.path.join(d, "current", "*.log")))


def _assert_readable(bookie, ledgers, entries_per_ledger=40):
    for ledger in ledgers:
        assert bookie.entry_ids(ledger) == list(range(entries_per_ledger))
        for e in range(entries_per_ledger):
            assert bookie.read_entry(ledger, e) == entry(ledger, e, body=BODY)


def test_gc_deletes_logs_of_deleted_ledgers_only(bookie_factory, settings_factory):
    # No background threads: a deletion would start a checkpoint and GC by itself.
    bookie = bookie_factory(_settings(settings_factory), start_background_threads=False)
    for e in range(40):
        bookie.add_entry(1, e, entry(1, e, body=BODY), KEY)
    bookie.checkpoint()
    for e in range(40):
        bookie.add_entry(2, e, entry(2, e, body=BODY), KEY)
    bookie.checkpoint()
    before = _log_bytes(bookie)
    bookie.delete_ledger(1)
    assert bookie.collect_garbage().logs_deleted == []  # the deletion is not checkpointed yet
    bookie.checkpoint()
    stats = bookie.collect_garbage()
    assert stats.logs_deleted
    # The first log held only ledger 1; the second is shared with ledger 2 and stays.
    assert _log_bytes(bookie) < before - 20 * len(BODY)
    _assert_readable(bookie, [2])


def test_compaction_reclaims_space_and_keeps_live_entries(bookie_factory, settings_factory):
    settings = _settings(settings_factory)
    bookie = bookie_factory(settings)
    _fill(bookie)
    before = _log_bytes(bookie)
    for ledger in LEDGERS[:8]:  # delete 80 %
        bookie.delete_ledger(ledger)
    bookie.checkpoint()
    for threshold in (0.2, 0.8):  # minor, then major compaction
        stats = bookie.compact(threshold)
        assert stats.logs_compacted and stats.entries_moved > 0
        _assert_readable(bookie, LEDGERS[8:])
        deleted = set(LEDGERS[:8])
        for log_id in bookie._entry_logs.log_ids():
            if log_id != bookie._entry_logs.current_log_id:
                assert bookie._gc.live_fraction(log_id, deleted) >= threshold
    bookie.checkpoint()
    after = _log_bytes(bookie)
    assert after < before * 0.35, (before, after)
    _assert_readable(bookie, LEDGERS[8:])
    bookie.close()
    reopened = bookie_factory(settings)
    _assert_readable(reopened, LEDGERS[8:])
    for ledger in LEDGERS[:8]:
        assert not reopened.ledger_exists(ledger)


class CrashAfter(Exception):
    """Raised by the fault hook to stop compaction at a chosen step."""


@pytest.mark.parametrize("step", ["after-copy", "after-relocate"])
def test_crash_in_the_middle_of_compaction_loses_nothing(bookie_factory, settings_factory,
                                                         monkeypatch, step):
    settings = _settings(settings_factory)
    bookie = bookie_factory(settings)
    _fill(bookie)
    for ledger in LEDGERS[:8]:
        bookie.delete_ledger(ledger)
    bookie.checkpoint()

    if step == "after-copy":
        # Copies appended and synced, the index not yet re-pointed.
        def relocate(self, moves):
            raise CrashAfter()
        monkeypatch.setattr(Index, "relocate", relocate)
    else:
        # Index re-pointed, the old log not yet removed.
        original_move = GarbageCollector._move

        def move(self, old_log_id, batch):
            original_move(self, old_log_id, batch)
            raise CrashAfter()
        monkeypatch.setattr(GarbageCollector, "_move", move)

    with pytest.raises(CrashAfter):
        bookie.compact(0.8)
    monkeypatch.undo()
    bookie.close()

    reopened = bookie_factory(settings)
    _assert_readable(reopened, LEDGERS[8:])
    reopened.compact(0.8)
    reopened.checkpoint()
    _assert_readable(reopened, LEDGERS[8:])
    # Every index entry points at an existing log.
    for ledger in LEDGERS[8:]:
        for e in range(40):
            location = reopened._index.location(ledger, e)
            assert location.log_id in reopened._entry_logs.log_ids()


def test_background_gc_removes_deleted_ledgers_logs(bookie_factory, settings_factory):
    settings = _settings(settings_factory).replace(gcWaitTime=50, flushInterval=50)
    bookie = bookie_factory(settings)
    for e in range(40):
        bookie.add_entry(1, e, entry(1, e, body=BODY), KEY)
    bookie.checkpoint()
    bookie.add_entry(2, 0, entry(2, 0), KEY)
    bookie.checkpoint()
    logs_of_1 = [log_id for log_id, m in bookie._entry_logs.ledger_maps.items()
                 if set(m) == {1}]
    assert logs_of_1
    bookie.delete_ledger(1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and \
            any(log_id in bookie._entry_logs.log_ids() for log_id in logs_of_1):
        time.sleep(0.05)
    assert not any(log_id in bookie._entry_logs.log_ids() for log_id in logs_of_1), \
        (logs_of_1, bookie._entry_logs.ledger_maps, bookie._entry_logs.current_log_id)
    assert bookie.read_entry(2, 0) == entry(2, 0)
