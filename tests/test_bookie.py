"""The bookie's operations and errors, on real files with real fsync."""

from __future__ import annotations

import glob
import os
import threading

import pytest
from conftest import KEY, entry
from storageutil import CountingIO, EntryLogWriteOutRecorder, close_as_if_crashed

from pybk.errors import (
    BookieClosed,
    EntryTooLarge,
    LedgerFenced,
    MalformedEntry,
    NoSuchEntry,
    NoSuchLedger,
    Unauthorized,
)
from pybk.net import wire
from pybk.storage import LAST_ENTRY, Bookie, entrylog
from pybk.storage.journal_codec import RECORD
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(60)


def test_add_then_read_back_before_and_after_checkpoint_and_restart(bookie_factory,
                                                                     settings_factory):
    settings = settings_factory()
    bookie = bookie_factory(settings)
    for e in range(50):
        bookie.add_entry(7, e, entry(7, e), KEY)
    assert bookie.read_entry(7, 10) == entry(7, 10)  # from the write cache
    bookie.checkpoint()
    assert bookie.read_entry(7, 10) == entry(7, 10)  # from an entry log via the index
    bookie.close()
    reopened = bookie_factory(settings)
    assert [reopened.read_entry(7, e) for e in range(50)] == [entry(7, e) for e in range(50)]
    assert reopened.entry_ids(7) == list(range(50))


def as_received(runs: list[tuple]) -> list[wire.AddRun]:
    """``runs`` as a bookie server hands them to its bookie: entries are views of the
    message's body (decoded with a limit the bookie's own checks then apply)."""
    limit = 1024 * 1024
    return wire.decode_adds(wire.encode_adds(runs, limit), limit)


@pytest.mark.parametrize("received", [False, True], ids=["bytes", "views"])
def test_a_batch_of_runs_fails_add_by_add_or_run_by_run_and_completes_once_durable(
        bookie_factory, settings_factory, received):
    settings = settings_factory(maxEntrySizeBytes=4096)
    bookie = bookie_factory(settings)
    bookie.add_entry(2, 0, entry(2, 0), KEY)
    bookie.fence(2, KEY).result(timeout=WAIT_S)
    bookie.add_entry(3, 0, entry(3, 0), KEY)
    runs = [(1, [0], [entry(1, 0)], KEY, False),
            (2, [1, 2], [entry(2, 1), entry(2, 2)], KEY, False),   # fenced: the whole run
            (3, [1], [entry(3, 1)], b"other key", False),          # wrong key
            (1, [1, 2, 3, 4], [entry(1, 1, body=bytes(5000)),      # too large
                               entry(1, 2),
                               entry(9, 3),                        # names another ledger
                               entry(1, 4)], KEY, False),
            (2, [1], [entry(2, 1)], KEY, True),      # recovery: a fenced ledger takes it
            (4, [0], [entry(4, 0)], KEY, False)]
    outcomes: list = []
    done = threading.Event()
    bookie.add_entries_async(as_received(runs) if received else runs,
                             lambda errors: (outcomes.append(errors), done.set()))
    assert done.wait(10)
    errors, = outcomes  # called once, with an outcome per add in run order
    assert [type(e) if e else None for e in errors] == [
        None, LedgerFenced, LedgerFenced, Unauthorized, EntryTooLarge, None, MalformedEntry,
        None, None, None]
    # Some adds failed: the cache holds copies, not views that would keep the message.
    assert type(bookie._active.get(1, 2)) is bytes
    cached = bookie.read_entry(1, 2)  # from the write cache
    assert type(cached) is bytes and cached == entry(1, 2)
    bookie.checkpoint()  # the entry log and the index get the same bytes
    assert bookie.read_entry(1, 2) == entry(1, 2)
    bookie.close()
    reopened = bookie_factory(settings)  # what the batch acknowledged is durable
    assert reopened.read_entry(1, 0) == entry(1, 0)
    assert reopened.read_entry(2, 1) == entry(2, 1)
    assert reopened.read_entry(4, 0) == entry(4, 0)
    assert [reopened.read_entry(1, e) for e in (2, 4)] == [entry(1, 2), entry(1, 4)]
    for ledger_id, entry_id in [(1, 1), (1, 3), (2, 2), (3, 1)]:
        with pytest.raises(NoSuchEntry):
            reopened.read_entry(ledger_id, entry_id)


def test_a_message_whose_adds_all_pass_is_kept_as_it_arrived(bookie):
    """Views of the body go to the write cache (and the journal) uncopied; a read copies
    an entry out."""
    done = threading.Event()
    data = bytes(wire.VIEW_MIN_MEAN_BYTES)  # entries large enough to be kept as views
    sent = {(lid, e): entry(lid, e, data) for lid, e in ((1, 0), (1, 1), (2, 0))}
    bookie.add_entries_async(as_received([(1, [0, 1], [sent[1, 0], sent[1, 1]], KEY,
                                           False), (2, [0], [sent[2, 0]], KEY, False)]),
                             lambda errors: done.set())
    assert done.wait(10)
    held = bookie._active.get(1, 1)
    assert isinstance(held, memoryview) and held == sent[1, 1]
    assert type(bookie.read_entry(1, 1)) is bytes
    bookie.checkpoint()
    assert {key: bookie.read_entry(*key) for key in sent} == sent


def test_a_batch_of_adds_fails_as_a_whole_on_a_closed_bookie(bookie):
    bookie.close()
    outcomes: list = []
    bookie.add_entries_async([(1, [0, 1], [entry(1, 0), entry(1, 1)], KEY, False)],
                             outcomes.append)
    assert [[type(e) for e in errors] for errors in outcomes] == [[BookieClosed] * 2]


def test_async_adds_complete_through_futures_and_callbacks(bookie):
    futures = [bookie.add_entry_async(1, e, entry(1, e), KEY) for e in range(100)]
    assert all(f.result(timeout=WAIT_S) is None for f in futures)
    done = threading.Event()
    outcomes = []

    def callback(error):
        outcomes.append(error)
        done.set()

    assert bookie.add_entry_async(1, 100, entry(1, 100), KEY, callback=callback) is None
    assert done.wait(10)
    assert outcomes == [None]


def test_read_last_entry_and_lac(bookie):
    with pytest.raises(NoSuchLedger):
        bookie.read_lac(3)
    for e in range(5):
        bookie.add_entry(3, e, entry(3, e, lac=e - 1), KEY)
    assert bookie.read_entry(3, LAST_ENTRY) == entry(3, 4)
    assert bookie.last_entry_id(3) == 4
    assert bookie.read_lac(3) == 3
    assert bookie.read_explicit_lac(3) is None
    bookie.set_explicit_lac(3, 4, KEY).result(timeout=WAIT_S)
    assert bookie.read_explicit_lac(3) == 4
    assert bookie.read_lac(3) == 4


def test_lac_watchers_fire_once_when_the_lac_passes_what_they_know(bookie):
    with pytest.raises(NoSuchLedger):
        bookie.watch_lac(4, -1, lambda: None)
    bookie.add_entry(4, 0, entry(4, 0, lac=-1), KEY)
    bookie.add_entry(4, 1, entry(4, 1, lac=0), KEY)
    fired: list[str] = []
    assert bookie.watch_lac(4, -1, lambda: fired.append("at -1")) is False  # already past
    assert bookie.watch_lac(4, 0, lambda: fired.append("at 0"))
    assert bookie.watch_lac(4, 1, lambda: fired.append("at 1"))
    removed = lambda: fired.append("removed")  # noqa: E731
    assert bookie.watch_lac(4, 0, removed)
    bookie.unwatch_lac(4, removed)
    bookie.add_entry(4, 2, entry(4, 2, lac=0), KEY)  # the LAC stays at 0
    assert fired == []
    bookie.add_entry(4, 3, entry(4, 3, lac=1), KEY)
    assert fired == ["at 0"]
    bookie.set_explicit_lac(4, 2, KEY).result(timeout=WAIT_S)
    assert fired == ["at 0", "at 1"]
    bookie.add_entry(4, 4, entry(4, 4, lac=3), KEY)
    bookie.set_explicit_lac(4, 5, KEY).result(timeout=WAIT_S)
    assert fired == ["at 0", "at 1"]  # each watcher fires once


def test_explicit_lac_and_lac_survive_a_crash(bookie_factory, settings_factory, tmp_path):
    settings = settings_factory()
    bookie = bookie_factory(settings)
    for e in range(3):
        bookie.add_entry(5, e, entry(5, e), KEY)
    bookie.set_explicit_lac(5, 2, KEY).result(timeout=WAIT_S)
    close_as_if_crashed(bookie, str(tmp_path))
    reopened = bookie_factory(settings)
    assert reopened.replayed_records > 0
    assert reopened.read_explicit_lac(5) == 2
    assert reopened.read_lac(5) == 2


def test_missing_ledger_and_entry_are_distinct_errors(bookie):
    with pytest.raises(NoSuchLedger, match="ledger 9"):
        bookie.read_entry(9, 0)
    bookie.add_entry(9, 0, entry(9, 0), KEY)
    with pytest.raises(NoSuchEntry, match="entry 1"):
        bookie.read_entry(9, 1)


def test_wrong_master_key_is_unauthorized(bookie):
    bookie.add_entry(4, 0, entry(4, 0), KEY)
    with pytest.raises(Unauthorized):
        bookie.add_entry(4, 1, entry(4, 1), b"another key")
    with pytest.raises(Unauthorized):
        bookie.fence(4, b"another key")
    with pytest.raises(NoSuchEntry):
        bookie.read_entry(4, 1)


def test_master_key_survives_restart(bookie_factory, settings_factory, tmp_path):
    settings = settings_factory()
    bookie = bookie_factory(settings)
    bookie.add_entry(4, 0, entry(4, 0), KEY)
    close_as_if_crashed(bookie, str(tmp_path))
    reopened = bookie_factory(settings)
    with pytest.raises(Unauthorized):
        reopened.add_entry(4, 1, entry(4, 1), b"another key")
    reopened.add_entry(4, 1, entry(4, 1), KEY)


@pytest.mark.parametrize("crash", [False, True], ids=["clean-restart", "crash"])
def test_fence_refuses_adds_accepts_recovery_adds_and_survives_restart(
        bookie_factory, settings_factory, tmp_path, crash):
    settings = settings_factory()
    bookie = bookie_factory(settings)
    bookie.add_entry(2, 0, entry(2, 0), KEY)
    bookie.fence(2, KEY).result(timeout=WAIT_S)
    assert bookie.is_fenced(2)
    with pytest.raises(LedgerFenced):
        bookie.add_entry(2, 1, entry(2, 1), KEY)
    bookie.add_entry(2, 1, entry(2, 1), KEY, recovery=True)
    if crash:
        close_as_if_crashed(bookie, str(tmp_path))
    else:
        bookie.close()
    reopened = bookie_factory(settings)
    assert reopened.is_fenced(2)
    with pytest.raises(LedgerFenced):
        reopened.add_entry(2, 2, entry(2, 2), KEY)
    assert reopened.read_entry(2, 1) == entry(2, 1)


def test_fencing_an_unknown_ledger_records_it(bookie):
    bookie.fence(11, KEY).result(timeout=WAIT_S)
    with pytest.raises(LedgerFenced):
        bookie.add_entry(11, 0, entry(11, 0), KEY)


@pytest.mark.parametrize("crash", [False, True], ids=["clean-restart", "crash"])
def test_deleted_ledger_is_gone_and_refuses_adds(bookie_factory, settings_factory, tmp_path,
                                                  crash):
    settings = settings_factory()
    # No housekeeping thread on either bookie: garbage collection, which forgets a deleted
    # ledger once no entry log holds it (test_gc_leaves_nothing_of_deleted_ledgers), would
    # forget ledger 8 (no entries) before the restart this test is about.
    bookie = bookie_factory(settings, start_background_threads=False)
    for e in range(10):
        bookie.add_entry(6, e, entry(6, e), KEY)
    bookie.checkpoint()
    bookie.add_entry(6, 10, entry(6, 10), KEY)
    bookie.fence(8, KEY).result(timeout=WAIT_S)
    bookie.delete_ledger(6)
    bookie.delete_ledger(8)
    if crash:
        close_as_if_crashed(bookie, str(tmp_path))
    else:
        bookie.close()
    reopened = bookie_factory(settings, start_background_threads=False)
    for e in (0, 10):
        with pytest.raises(NoSuchLedger):
            reopened.read_entry(6, e)
    assert not reopened.ledger_exists(6)
    with pytest.raises(NoSuchLedger, match="deleted"):
        reopened.add_entry(6, 11, entry(6, 11), KEY)
    with pytest.raises(LedgerFenced, match="deleted"):  # fenced, then deleted: still fenced
        reopened.add_entry(8, 0, entry(8, 0), KEY, recovery=False)
    for ledger_id in (6, 8):  # a recoverer finds nothing to fence (BookKeeper: NoSuchLedger)
        with pytest.raises(NoSuchLedger, match="deleted"):
            reopened.fence(ledger_id, KEY)
    with pytest.raises(LedgerFenced, match="deleted"):  # and the fence changed nothing
        reopened.add_entry(8, 0, entry(8, 0), KEY, recovery=False)


def test_deleting_an_unknown_ledger_refuses_its_later_adds(bookie):
    bookie.delete_ledger(12)
    with pytest.raises(NoSuchLedger, match="deleted"):
        bookie.add_entry(12, 0, entry(12, 0), KEY)


def test_force_completes_once_durable_with_the_entries_held_of_a_range(bookie):
    for entry_id in (0, 1, 3):
        bookie.add_entry_async(1, entry_id, entry(1, entry_id), KEY)
    assert bookie.force(1).result(timeout=WAIT_S) == 0  # an empty range: nothing asked
    assert bookie.force(1, 1, 4).result(timeout=WAIT_S) == 2
    assert bookie.force(1, 2, 2 ** 62).result(timeout=WAIT_S) == 1  # as far as it holds
    with pytest.raises(NoSuchLedger):
        bookie.force(99)


def test_entry_limits_and_malformed_entries(bookie_factory, settings_factory):
    bookie = bookie_factory(settings_factory(maxEntrySizeBytes=4096, logSizeLimit=1 << 20))
    with pytest.raises(EntryTooLarge, match="maxEntrySizeBytes=4096"):
        bookie.add_entry(1, 0, entry(1, 0, body=b"x" * 5000), KEY)
    with pytest.raises(MalformedEntry, match="shorter than"):
        bookie.add_entry(1, 0, b"short", KEY)
    with pytest.raises(MalformedEntry, match="ledger 2 entry 0"):
        bookie.add_entry(1, 0, entry(2, 0), KEY)
    with pytest.raises(NoSuchLedger):
        bookie.read_entry(1, 0)


def test_closed_bookie_refuses_everything(bookie):
    bookie.add_entry(1, 0, entry(1, 0), KEY)
    bookie.close()
    with pytest.raises(BookieClosed):
        bookie.add_entry(1, 1, entry(1, 1), KEY)
    with pytest.raises(BookieClosed):
        bookie.read_entry(1, 0)
    bookie.close()  # closing twice is harmless


def test_group_commit_shares_fdatasyncs(bookie_factory):
    io = CountingIO()
    bookie = bookie_factory(io=io)
    before = io.journal_syncs
    futures = [bookie.add_entry_async(1, e, entry(1, e), KEY) for e in range(2000)]
    for f in futures:
        f.result(timeout=30)
    syncs = io.journal_syncs - before
    assert 1 <= syncs < 2000 / 4, f"{syncs} fdatasyncs for 2000 queued adds"


def test_group_wait_collects_a_group_into_one_fdatasync(bookie_factory, settings_factory):
    io = CountingIO()
    settings = settings_factory(journalFlushWhenQueueEmpty=False, journalMaxGroupWaitMSec=500)
    bookie = bookie_factory(settings, io=io)
    before = io.journal_syncs
    futures = [bookie.add_entry_async(1, e, entry(1, e), KEY) for e in range(20)]
    for f in futures:
        f.result(timeout=WAIT_S)
    assert io.journal_syncs - before <= 2  # the first add opens a group that waits 500 ms


def test_buffered_writes_threshold_ends_the_group_wait(bookie_factory, settings_factory):
    settings = settings_factory(journalFlushWhenQueueEmpty=False, journalMaxGroupWaitMSec=60_000,
                                journalBufferedWritesThreshold=8192)
    bookie = bookie_factory(settings)
    futures = [bookie.add_entry_async(1, e, entry(1, e, body=b"z" * 1000), KEY)
               for e in range(80)]
    # 80 KB of records against an 8 KB threshold: the groups go out long before the
    # one-minute group wait would end.
    for f in futures:
        f.result(timeout=WAIT_S)


def test_journal_rolls_and_old_journals_are_removed_keeping_backups(bookie_factory,
                                                                    settings_factory):
    settings = settings_factory(journalMaxSizeMB=1, journalMaxBackups=2)
    bookie = bookie_factory(settings)
    body = b"j" * 60_000
    for e in range(100):  # about 6 MB of journal: six or more files
        bookie.add_entry(1, e, entry(1, e, body=body), KEY)
    journals = glob.glob(os.path.join(bookie.journal_dir, "*.txn"))
    assert len(journals) >= 6
    bookie.checkpoint()
    remaining = sorted(glob.glob(os.path.join(bookie.journal_dir, "*.txn")))
    assert len(remaining) == 3  # the current journal and two backups
    assert [bookie.read_entry(1, e) for e in (0, 50, 99)] == \
        [entry(1, e, body=body) for e in (0, 50, 99)]


def test_entry_logs_roll_and_are_sealed_with_ledger_maps(bookie_factory, settings_factory):
    settings = settings_factory(logSizeLimit=1 << 20, maxEntrySizeBytes=256 << 10)
    bookie = bookie_factory(settings)
    body = b"e" * 50_000
    for e in range(60):
        for ledger in (1, 2):
            bookie.add_entry(ledger, e, entry(ledger, e, body=body), KEY)
    bookie.checkpoint()
    bookie.close()
    reopened = bookie_factory(settings)
    logs = reopened._entry_logs
    assert len(logs.log_ids()) >= 6
    for log_id in logs.log_ids():
        assert set(logs.ledger_maps[log_id]) <= {1, 2}
    total = sum(sum(m.values()) for m in logs.ledger_maps.values())
    assert total >= 120 * 50_000
    assert reopened.read_entry(2, 59) == entry(2, 59, body=body)


def test_reads_across_many_entry_logs_keep_few_open(bookie_factory, settings_factory,
                                                    monkeypatch):
    """At most READ_FDS_MAX entry logs are open for reading at once, however many the
    reads touch, and reads racing the closing of a descriptor still get their bytes."""
    monkeypatch.setattr(entrylog, "READ_FDS_MAX", 3)
    settings = settings_factory(logSizeLimit=1 << 20, maxEntrySizeBytes=256 << 10)
    bookie = bookie_factory(settings)
    body = b"f" * 100_000
    for e in range(80):
        bookie.add_entry(1, e, entry(1, e, body=body), KEY)
    bookie.checkpoint()
    assert len(bookie._entry_logs.log_ids()) >= 8
    failures: list[BaseException] = []

    def read_all(order: list[int]) -> None:
        try:
            for e in order:
                assert bookie.read_entry(1, e) == entry(1, e, body=body), e
        except BaseException as error:  # noqa: BLE001 - reported below
            failures.append(error)

    threads = [threading.Thread(target=read_all, args=(list(range(80))[::step],))
               for step in (1, -1, 3, -7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    ours = tuple(os.path.realpath(d) for d in settings.ledgerDirectories)
    open_logs = [target for target in (os.path.realpath(f"/proc/self/fd/{fd}")
                                       for fd in os.listdir("/proc/self/fd"))
                 if target.endswith(".log") and target.startswith(ours)]
    assert len(open_logs) <= 3 + 1, open_logs  # the readers' and the current log's


@pytest.mark.parametrize("flush_bytes", [0, 64 << 10])
def test_a_checkpoint_writes_entry_logs_out_every_flush_entrylog_bytes(bookie_factory,
                                                                       settings_factory,
                                                                       flush_bytes):
    # No timed checkpoint: on a loaded machine the adds can outlast flushInterval.
    settings = settings_factory(flushEntrylogBytes=flush_bytes, flushInterval=3_600_000)
    io = EntryLogWriteOutRecorder()
    bookie = bookie_factory(settings, io=io)
    body = b"r" * 3000
    for e in range(200):
        for ledger in (1, 2):
            bookie.add_entry(ledger, e, entry(ledger, e, body=body), KEY)
    bookie.checkpoint()
    assert io.syncs == 1  # durable once, at the end of the checkpoint
    record = RECORD.size + len(entry(1, 0, body=body))  # the record header, then the entry
    total = 400 * record
    if flush_bytes:
        # Consecutive pieces of at most a step plus one record, from the log's first
        # record on; only the last piece (under a step) is left to the fdatasync.
        assert max(nbytes for _offset, nbytes in io.written_out) <= flush_bytes + record
        assert all(offset + nbytes == following for (offset, nbytes), (following, _) in
                   zip(io.written_out, io.written_out[1:]))
        assert total - flush_bytes <= sum(n for _o, n in io.written_out) <= total
    else:
        assert io.written_out == []
    bookie.close()
    reopened = bookie_factory(settings)
    assert [reopened.read_entry(ledger, e) for ledger in (1, 2) for e in (0, 123, 199)] \
        == [entry(ledger, e, body=body) for ledger in (1, 2) for e in (0, 123, 199)]


def test_blocking_add_from_a_completion_callback_is_refused_not_deadlocked(bookie):
    errors = []
    done = threading.Event()

    def callback(_error):
        try:
            bookie.add_entry(1, 1, entry(1, 1), KEY)
        except Exception as e:  # noqa: BLE001 - the test records what was raised
            errors.append(e)
        done.set()

    bookie.add_entry_async(1, 0, entry(1, 0), KEY, callback=callback)
    assert done.wait(10)
    assert len(errors) == 1 and "completion callback" in str(errors[0])
    with pytest.raises(NoSuchEntry):  # refused before anything was queued
        bookie.read_entry(1, 1)


def test_async_add_from_a_completion_callback_works(bookie):
    done = threading.Event()

    def chain(entry_id):
        def callback(error):
            assert error is None
            if entry_id == 20:
                done.set()
            else:
                bookie.add_entry_async(1, entry_id + 1, entry(1, entry_id + 1), KEY,
                                       callback=chain(entry_id + 1))
        return callback

    bookie.add_entry_async(1, 0, entry(1, 0), KEY, callback=chain(0))
    assert done.wait(20)
    assert bookie.entry_ids(1) == list(range(21))


def test_many_threads_add_concurrently(bookie):
    def writer(ledger):
        for e in range(200):
            bookie.add_entry(ledger, e, entry(ledger, e), KEY)

    threads = [threading.Thread(target=writer, args=(ledger,)) for ledger in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    for ledger in range(8):
        assert bookie.entry_ids(ledger) == list(range(200))
        assert bookie.read_entry(ledger, 199) == entry(ledger, 199)


def test_unformatted_bookie_is_refused(settings_factory):
    from pybk.errors import InvalidCookie
    settings = settings_factory()
    for d in (settings.journalDirectory, *settings.ledgerDirectories):
        os.makedirs(d)
    with pytest.raises(InvalidCookie, match="never formatted"):
        Bookie(settings)


def test_write_cache_is_bounded_and_forces_checkpoints(bookie_factory, settings_factory):
    """With a 1 MiB write cache and no timed checkpoint, 8 MiB of adds still complete: a
    full cache half triggers a checkpoint, and adds wait for it instead of growing."""
    settings = settings_factory(writeCacheMaxSizeMb=1, maxEntrySizeBytes=64 << 10,
                                flushInterval=3_600_000)
    bookie = bookie_factory(settings)
    body = b"w" * 16_000
    largest = 0
    futures = []
    for e in range(512):
        futures.append(bookie.add_entry_async(1, e, entry(1, e, body=body), KEY))
        largest = max(largest, bookie._active.size_bytes)
    for f in futures:
        f.result(timeout=30)
    assert largest <= (1 << 19) + 16_100  # half the cache, plus the add that filled it
    logs = glob.glob(os.path.join(settings.ledgerDirectories[0], "current", "*.log")) + \
        glob.glob(os.path.join(settings.ledgerDirectories[1], "current", "*.log"))
    assert logs, "the cache bound forced checkpoints into entry logs"
    assert bookie.read_entry(1, 511) == entry(1, 511, body=body)


def test_journal_queue_bound_applies_back_pressure_without_deadlock(bookie_factory,
                                                                     settings_factory):
    """A 4-record journal queue: 2000 async adds from one thread still all complete."""
    bookie = bookie_factory(settings_factory(journalQueueSize=4))
    futures = [bookie.add_entry_async(1, e, entry(1, e), KEY) for e in range(2000)]
    assert all(f.result(timeout=30) is None for f in futures)
    assert bookie.entry_ids(1) == list(range(2000))


def test_a_second_bookie_on_the_same_directories_is_refused(bookie_factory, settings_factory):
    from pybk.errors import BookKeeperError
    settings = settings_factory()
    bookie = bookie_factory(settings)
    with pytest.raises(BookKeeperError, match="is locked"):
        Bookie(settings)
    bookie.close()
    bookie_factory(settings).add_entry(1, 0, entry(1, 0), KEY)  # free again once closed


def test_adds_queued_without_waking_are_committed_by_the_caller(bookie):
    """``add_entries_async(wake=False)`` leaves the journal thread asleep and
    ``commit_queued`` writes and syncs the group on the calling thread, which runs the
    callback (unless the journal thread, awake for its own reasons, took the group
    first): how the bookie server answers a lone writer without a thread switch."""
    on_caller = 0
    for entry_id in range(100):
        outcomes: list[tuple[int, list]] = []
        bookie.add_entries_async([(7, [entry_id], [entry(7, entry_id)], KEY, False)],
                                 lambda errors, outcomes=outcomes: outcomes.append(
                                     (threading.get_ident(), errors)), wake=False)
        bookie.commit_queued()
        bookie.force(7).result(timeout=WAIT_S)  # also when the journal thread took it
        assert [errors for _thread, errors in outcomes] == [[None]]
        on_caller += outcomes[0][0] == threading.get_ident()
    assert on_caller >= 90
    assert bookie.entry_ids(7) == list(range(100))


def test_a_leading_thread_syncs_its_own_adds(bookie):
    """Inside ``leading()`` an asynchronous add does not wake the journal thread; at the
    end of the block the caller writes the group itself, so the callback has run on the
    caller's thread by the time the block ends (unless the journal thread, awake for
    its own reasons, took the group first)."""
    on_caller = 0
    for entry_id in range(100):
        ran_on: list[int] = []
        with bookie.leading():
            bookie.add_entry_async(7, entry_id, entry(7, entry_id), KEY,
                                   callback=lambda error, ran_on=ran_on: ran_on.append(
                                       threading.get_ident()))
        bookie.force(7).result(timeout=WAIT_S)
        on_caller += ran_on == [threading.get_ident()]
    assert on_caller >= 90
    assert bookie.entry_ids(7) == list(range(100))
