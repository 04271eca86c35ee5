"""A bookie's memory and index do not grow with every ledger it ever held: idle ledger
states leave memory (and come back from the index, also after a crash), and a deleted
ledger leaves nothing once garbage collection removed its entry logs."""

from __future__ import annotations

import os
from concurrent.futures import Future

import lmdb
import pytest
from conftest import KEY, entry
from storageutil import close_as_if_crashed

from pybk.errors import LedgerFenced, NoSuchLedger, Unauthorized
from pybk.storage import bookie as bookie_module
from pybk.storage.index import INDEX_VERSION, Index, StoredLedgerState
from pybk.testing import WAIT_S

pytestmark = pytest.mark.timeout(120)

KEPT = 8
LEDGERS = range(1, 41)


@pytest.fixture
def few_states(monkeypatch):
    monkeypatch.setattr(bookie_module, "IDLE_STATES_KEPT", KEPT)


def _quiet(settings_factory, **overrides):
    # No automatic checkpoint or GC: each test decides when they run.
    return settings_factory(flushInterval=3_600_000, gcWaitTime=3_600_000,
                            minorCompactionInterval=0, majorCompactionInterval=0, **overrides)


def _fill(bookie):
    """Two entries in each ledger; every third fenced, every fifth with an explicit LAC."""
    for e in range(2):
        for ledger in LEDGERS:
            bookie.add_entry(ledger, e, entry(ledger, e), KEY)
    for ledger in LEDGERS:
        if ledger % 3 == 0:
            bookie.fence(ledger, KEY).result(timeout=WAIT_S)
        if ledger % 5 == 0:
            bookie.set_explicit_lac(ledger, 7, KEY).result(timeout=WAIT_S)


def _assert_states(bookie):
    for ledger in LEDGERS:
        assert bookie.read_entry(ledger, 1) == entry(ledger, 1)
        assert bookie.read_lac(ledger) == (7 if ledger % 5 == 0 else 0)
        assert bookie.is_fenced(ledger) == (ledger % 3 == 0)
        with pytest.raises(Unauthorized):
            bookie.add_entry(ledger, 2, entry(ledger, 2), b"another key")
        if ledger % 3 == 0:
            with pytest.raises(LedgerFenced):
                bookie.add_entry(ledger, 2, entry(ledger, 2), KEY)


def test_idle_ledger_states_leave_memory_and_come_back_from_the_index(
        few_states, bookie_factory, settings_factory):
    bookie = bookie_factory(_quiet(settings_factory))
    _fill(bookie)
    assert bookie.ledger_states_in_memory >= len(LEDGERS)
    bookie.checkpoint()
    assert bookie.ledger_states_in_memory <= KEPT
    _assert_states(bookie)  # every state read back loads it again...
    bookie.checkpoint()
    assert bookie.ledger_states_in_memory <= KEPT  # ...and the next checkpoint drops it
    bookie.add_entry(1, 2, entry(1, 2), KEY)  # an evicted ledger takes adds with its key
    assert bookie.read_lac(1) == 1


def test_a_ledger_changed_since_the_last_checkpoint_keeps_its_state(
        few_states, bookie_factory, settings_factory):
    bookie = bookie_factory(_quiet(settings_factory))
    _fill(bookie)
    bookie.checkpoint()
    for ledger in LEDGERS:  # every ledger changes again: none may be dropped
        bookie.add_entry(ledger, 3, entry(ledger, 3, lac=2), KEY, recovery=True)
    bookie.checkpoint()  # commits them; the cut made them clean
    assert bookie.ledger_states_in_memory <= KEPT
    for ledger in LEDGERS:
        assert bookie.read_lac(ledger) == (7 if ledger % 5 == 0 else 2)


@pytest.mark.parametrize("crash", [False, True], ids=["clean-restart", "crash"])
def test_states_survive_a_restart_after_eviction(few_states, bookie_factory, settings_factory,
                                                 tmp_path, crash):
    settings = _quiet(settings_factory)
    bookie = bookie_factory(settings)
    _fill(bookie)
    bookie.checkpoint()
    assert bookie.ledger_states_in_memory <= KEPT
    # Changes after the eviction live in the journal only until the next checkpoint.
    bookie.fence(4, KEY).result(timeout=WAIT_S)
    bookie.set_explicit_lac(4, 7, KEY).result(timeout=WAIT_S)
    if crash:
        close_as_if_crashed(bookie, str(tmp_path))
    else:
        bookie.close()
    reopened = bookie_factory(settings)
    assert reopened.is_fenced(4) and reopened.read_lac(4) == 7
    for ledger in LEDGERS:
        if ledger != 4:
            assert reopened.read_entry(ledger, 0) == entry(ledger, 0)
            assert reopened.is_fenced(ledger) == (ledger % 3 == 0)
            assert reopened.read_lac(ledger) == (7 if ledger % 5 == 0 else 0)


def _index_rows(settings):
    """What a closed bookie's index holds of ledgers: states and deletion rows."""
    index = Index(os.path.join(settings.ledgerDirectories[0], "current", "index"),
                  read_only=True)
    try:
        return dict(index.ledger_states()), index.deleted_ledgers()
    finally:
        index.close()


def test_gc_leaves_nothing_of_deleted_ledgers(bookie_factory, settings_factory):
    settings = _quiet(settings_factory, logSizeLimit=64 << 10, maxEntrySizeBytes=16 << 10,
                      writeCacheMaxSizeMb=1)
    bookie = bookie_factory(settings, start_background_threads=False)
    _fill(bookie)
    bookie.checkpoint()
    deleted = [ledger for ledger in LEDGERS if ledger > 2]
    for ledger in deleted:
        bookie.delete_ledger(ledger)
    bookie.checkpoint()
    assert bookie.gauges().ledgers == 2
    with pytest.raises(NoSuchLedger, match="deleted"):
        bookie.add_entry(5, 2, entry(5, 2), KEY)
    # The current entry log is never collected: roll past it with the live ledgers.
    for e in range(2, 40):
        bookie.add_entry(1, e, entry(1, e, body=b"x" * 4000), KEY)
        bookie.add_entry(2, e, entry(2, e, body=b"x" * 4000), KEY)
    bookie.checkpoint()
    stats = bookie.compact(1.0)  # collects, and copies the live ledgers out of shared logs
    assert stats.logs_deleted or stats.logs_compacted
    assert bookie.ledger_states_in_memory <= 2
    assert bookie.gauges().ledgers == 2
    for ledger in deleted:
        assert not bookie.ledger_exists(ledger)
    assert bookie.entry_ids(1) == list(range(40))
    bookie.close()
    states, tombstones = _index_rows(settings)
    assert sorted(states) == [1, 2] and tombstones == []


def test_an_index_of_the_previous_format_is_upgraded(tmp_path):
    directory = str(tmp_path / "index")
    index = Index(directory)
    index.commit_checkpoint(iter(()), {5: StoredLedgerState(KEY, False, True, 3, None),
                                       6: StoredLedgerState(KEY, True, False, 3, None)},
                            [5], 0)
    index.close()
    env = lmdb.open(directory, max_dbs=4)  # as version 1 left it: no deleted table
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"deleted", txn=txn))
        txn.delete(b"index_version", db=env.open_db(b"meta", txn=txn))
    env.close()
    assert Index(directory, read_only=True).deleted_ledgers() == [5]
    index = Index(directory)
    try:
        assert index.version() == INDEX_VERSION and index.deleted_ledgers() == [5]
    finally:
        index.close()


@pytest.mark.parametrize("live", [1, 30], ids=["fewer-states", "fewer-rows"])
def test_a_live_state_removes_the_ledgers_deletion_row(tmp_path, live):
    """Whichever of the deletion rows and the committed states is the smaller, a ledger
    committed live loses its deletion row, and the other rows stay."""
    index = Index(str(tmp_path / "index"))
    try:
        index.commit_checkpoint(iter(()), {lid: StoredLedgerState(KEY, False, True, 3, None)
                                           for lid in range(10, 20)}, [], 0)
        index.commit_checkpoint(iter(()), {lid: StoredLedgerState(b"k2", False, False, -1, None)
                                           for lid in range(15, 15 + live)}, [], 0)
        assert index.deleted_ledgers() == [lid for lid in range(10, 20)
                                           if not 15 <= lid < 15 + live]
        assert not index.ledger_state(15).deleted
    finally:
        index.close()


def _replay_a_ledger_forgotten_and_made_again(bookie_factory, settings, scratch):
    """A crash after the checkpoint that made ledger 5's deletion durable (GC forgot it,
    the same id was used again, one entry added) but before its LastLogMark; the
    bookie reopened from that crash (ledger 6 holds 20 entries throughout)."""
    bookie = bookie_factory(settings, start_background_threads=False)
    for e in range(20):
        bookie.add_entry(5, e, entry(5, e, body=b"o" * 4000), KEY)
    bookie.checkpoint()
    mark_files = [os.path.join(d, "current", "lastMark") for d in settings.ledgerDirectories]
    marks_before_deletion = []
    for path in mark_files:
        with open(path, "rb") as f:
            marks_before_deletion.append(f.read())
    bookie.delete_ledger(5)
    for e in range(20):  # roll past the log holding ledger 5 so that GC may remove it
        bookie.add_entry(6, e, entry(6, e, body=b"x" * 4000), KEY)
    bookie.checkpoint()
    bookie.compact(1.0)  # removes ledger 5's logs, copying ledger 6's entries out of them
    assert not bookie.ledger_exists(5)
    bookie.add_entry(5, 0, entry(5, 0, body=b"new"), b"another key")  # a new ledger 5
    close_as_if_crashed(bookie, scratch)
    for path, mark in zip(mark_files, marks_before_deletion):  # as if the crash came first
        with open(path, "wb") as f:
            f.write(mark)
    return bookie_factory(settings, start_background_threads=False)


def test_a_ledger_forgotten_and_made_again_survives_a_replay_of_both(bookie_factory,
                                                                      settings_factory,
                                                                      tmp_path):
    """Replay sees the deletion and the new ledger's master key and adds, and keeps the
    new ledger's adds."""
    settings = _quiet(settings_factory, logSizeLimit=64 << 10, maxEntrySizeBytes=16 << 10,
                      writeCacheMaxSizeMb=1)
    reopened = _replay_a_ledger_forgotten_and_made_again(bookie_factory, settings,
                                                         str(tmp_path))
    assert reopened.entry_ids(5) == [0]
    assert reopened.read_entry(5, 0) == entry(5, 0, body=b"new")
    with pytest.raises(Unauthorized):
        reopened.add_entry(5, 1, entry(5, 1), KEY)
    assert reopened.entry_ids(6) == list(range(20))


def test_a_ledger_made_again_in_replay_is_not_collected_as_deleted(bookie_factory,
                                                                   settings_factory, tmp_path):
    """After that replay the new ledger 5 is live: GC and compaction keep its entry, and
    the index has no deletion row for it (a later start would take it for deleted)."""
    settings = _quiet(settings_factory, logSizeLimit=64 << 10, maxEntrySizeBytes=16 << 10,
                      writeCacheMaxSizeMb=1)
    reopened = _replay_a_ledger_forgotten_and_made_again(bookie_factory, settings,
                                                         str(tmp_path))
    for e in range(20, 40):  # roll past the log the replay wrote to, so GC may take it
        reopened.add_entry(6, e, entry(6, e, body=b"x" * 4000), KEY)
    reopened.checkpoint()
    reopened.compact(1.0)
    assert reopened.read_entry(5, 0) == entry(5, 0, body=b"new")
    assert reopened.gauges().ledgers == 2
    reopened.close()
    states, tombstones = _index_rows(settings)
    assert 5 in states and not states[5].deleted and tombstones == []
    again = bookie_factory(settings, start_background_threads=False)
    again.compact(1.0)
    assert again.read_entry(5, 0) == entry(5, 0, body=b"new")
    again.add_entry(5, 1, entry(5, 1), b"another key")  # its key came back from the index
    assert again.entry_ids(6) == list(range(40))


def test_a_new_ledger_above_every_stored_id_needs_no_index_lookup(
        few_states, bookie_factory, settings_factory, monkeypatch):
    settings = _quiet(settings_factory)
    bookie = bookie_factory(settings)
    _fill(bookie)
    bookie.checkpoint()  # ledgers 1..40 stored, most evicted
    lookups: list[int] = []
    looked_up = Index.ledger_state
    monkeypatch.setattr(Index, "ledger_state",
                        lambda index, ledger_id: lookups.append(ledger_id)
                        or looked_up(index, ledger_id))
    bookie.add_entry(100, 0, entry(100, 0), KEY)
    assert lookups == []
    bookie.checkpoint()
    # Ids need not come in order: one below the highest stored is looked up, then made.
    bookie.add_entry(50, 0, entry(50, 0), KEY)
    assert lookups == [50]
    with pytest.raises(Unauthorized):  # an evicted ledger below it is still found
        bookie.add_entry(2, 2, entry(2, 2), b"another key")
    assert lookups[-1] == 2
    bookie.close()
    reopened = bookie_factory(settings)
    for ledger in (100, 50, 2):
        assert reopened.read_entry(ledger, 0) == entry(ledger, 0)
        with pytest.raises(Unauthorized):
            reopened.add_entry(ledger, 3, entry(ledger, 3), b"another key")


@pytest.mark.parametrize("crash", [False, True], ids=["clean-restart", "crash"])
def test_deleting_a_durably_deleted_ledger_again_survives_a_failed_checkpoint_and_gc(
        bookie_factory, settings_factory, monkeypatch, tmp_path, crash):
    """Ledger 5's deletion is committed; it is deleted again, and the next checkpoint's
    index commit fails while a GC pass forgets ledger 5.  The retried checkpoint succeeds,
    and ledger 5 stays gone (as one the bookie never held), also after a restart."""
    settings = _quiet(settings_factory)
    bookie = bookie_factory(settings, start_background_threads=False)
    bookie.fence(5, KEY).result(timeout=WAIT_S)  # a ledger with a key and no entries
    bookie.add_entry(6, 0, entry(6, 0), KEY)
    bookie.checkpoint()
    bookie.delete_ledger(5)
    bookie.checkpoint()  # the deletion is durable; no entry log holds ledger 5
    bookie.delete_ledger(5)  # a second delete (a retried request)
    commit = bookie._index.commit_checkpoint
    failures: list[OSError] = []

    def commit_failing_once_after_gc(*args, **kwargs):
        if failures:
            return commit(*args, **kwargs)
        bookie.collect_garbage()  # the housekeeping thread's pass, mid-checkpoint
        failures.append(OSError("injected index commit failure"))
        raise failures[-1]

    monkeypatch.setattr(bookie._index, "commit_checkpoint", commit_failing_once_after_gc)
    with pytest.raises(OSError, match="injected"):
        bookie.checkpoint()
    bookie.checkpoint()  # the retry
    bookie.collect_garbage()
    assert not bookie.ledger_exists(5) and bookie.gauges().ledgers == 1
    if crash:
        close_as_if_crashed(bookie, str(tmp_path))
    else:
        bookie.close()
    states, tombstones = _index_rows(settings)
    assert sorted(states) == [6] and tombstones == []
    reopened = bookie_factory(settings, start_background_threads=False)
    reopened.collect_garbage()
    assert not reopened.ledger_exists(5) and reopened.gauges().ledgers == 1
    assert reopened.read_entry(6, 0) == entry(6, 0)


def test_a_guarded_bookie_checks_adds_to_ledgers_it_forgot_also_after_a_restart(
        bookie_factory, settings_factory):
    """The highest forgotten id is a tombstone kept in the index: with a guard (a
    cluster node's), a plain add to a ledger at or below it waits for the check and is
    refused as the check says, before and after a restart; a recovery add, a fence and a
    ledger above it never ask.  Without a guard (the embedded WAL) nothing is checked."""
    settings = _quiet(settings_factory, logSizeLimit=64 << 10, maxEntrySizeBytes=16 << 10,
                      writeCacheMaxSizeMb=1)
    bookie = bookie_factory(settings, start_background_threads=False)
    for e in range(20):
        bookie.add_entry(5, e, entry(5, e, body=b"o" * 4000), KEY)
    bookie.checkpoint()
    bookie.delete_ledger(5)
    for e in range(20):  # roll past the log holding ledger 5 so that GC may remove it
        bookie.add_entry(6, e, entry(6, e, body=b"x" * 4000), KEY)
    bookie.checkpoint()
    bookie.compact(1.0)
    bookie.close()
    bookie = bookie_factory(settings, start_background_threads=False)
    with pytest.raises(NoSuchLedger) as unknown:
        bookie.read_entry(5, 0)
    assert "deleted" not in str(unknown.value)  # forgotten: no state left to say so
    asked: list[int] = []

    def refuse(ledger_id: int) -> Future:
        asked.append(ledger_id)
        answer: Future = Future()
        answer.set_exception(LedgerFenced(f"ledger {ledger_id} was deleted"))
        return answer

    bookie.guard_unknown_ledgers(refuse)
    with pytest.raises(LedgerFenced, match="was deleted"):
        bookie.add_entry(5, 20, entry(5, 20), KEY)
    refused: Future = Future()
    bookie.add_entries_async([(5, [21], [entry(5, 21)], KEY, False)], refused.set_result)
    assert isinstance(refused.result(timeout=WAIT_S)[0], LedgerFenced)
    with pytest.raises(NoSuchLedger):  # an idle writer's explicit LAC makes nothing
        bookie.set_explicit_lac(5, 20, KEY)
    assert asked == [5, 5] and not bookie.ledger_exists(5)
    bookie.add_entry(7, 0, entry(7, 0), KEY)  # above the tombstone: a new ledger
    bookie.add_entry(4, 0, entry(4, 0), KEY, recovery=True)  # recovery adds never ask
    assert not bookie.fence(3, KEY).result(timeout=WAIT_S)  # fences neither (held before: no)
    assert asked == [5, 5]
    bookie.guard_unknown_ledgers(None)  # unguarded: a forgotten ledger is made again
    bookie.add_entry(5, 0, entry(5, 0), b"another key")
    assert bookie.read_entry(5, 0) == entry(5, 0) and asked == [5, 5]
