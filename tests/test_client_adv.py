"""BookKeeper 4.x client features on the ledger protocol: reading past the LAC
(``read_unconfirmed``), any one bookie's LAC (``try_read_last_add_confirmed``), and
ledgers whose writer gives the entry ids (``create_ledger_adv``,
:mod:`pybk.client.ledger_adv`), with their failure cases: a bookie crash under a reader,
a bookie failing while ids are held back, recovery of a ledger with a missing id, bad
ids.  Every test runs over each transport, as tests/test_client.py's do (its fixtures)."""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest
from clientutil import FAST, PROCESSES, BookiePool, clusters
from test_client import PASSWORD, bookie_pool, cluster_of, payload  # noqa: F401 (fixtures)

from pybk import WriteFlag
from pybk.client import LedgerHandleAdv
from pybk.errors import (
    BookKeeperError,
    DuplicateEntryId,
    InvalidConfiguration,
    InvalidEntryId,
    InvalidLedgerMetadata,
    LedgerClosed,
    LedgerExists,
    LedgerFenced,
    NoSuchEntry,
)
from pybk.meta.ledger_metadata import LedgerState
from pybk.testing import WAIT_S, returns_in_time, wait_until

pytestmark = pytest.mark.timeout(120)

#: Held-back adds must outlive a test's steps: no bookie is replaced for being slow here.
#: Adds that never time out while a test runs (ten minutes): what a test sees happens
#: for another reason, and a call that waited for a timeout would outlast the test.
PATIENT = dataclasses.replace(FAST, addEntryTimeout=600.0)


def stored_everywhere(cluster, lh, entry_id: int) -> None:
    """Wait until every bookie of the entry's write set stores it."""
    write_set = sorted(lh.metadata.write_set(entry_id))
    wait_until(lambda: sorted(cluster.holders(lh.id, entry_id)) == write_set,
               f"entry {entry_id} on {write_set}")


def crash(cluster, bookie_id: str) -> None:
    """The bookie stops answering: closed (in-process), its server gone (ZeroMQ), or cut
    off (the shared pool's processes; a real SIGKILL is the last test's)."""
    if cluster.transport == "inprocess":
        cluster.stop_bookie(bookie_id)
    elif cluster.transport == PROCESSES:
        cluster.faults[bookie_id].unreachable = True
    else:
        cluster.servers[bookie_id].close()


# -- read_unconfirmed and try_read_last_add_confirmed ------------------------------------

def test_read_unconfirmed_reads_past_the_lac_and_try_read_follows_the_bookies(cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client(PATIENT).create_ledger(3, 3, 2, password=PASSWORD)
    for i in range(5):
        lh.add_entry(payload(i))
    # Entry 5 reaches every bookie, but two hold their answers back: not acknowledged.
    held = lh.metadata.write_set(5)[1:]
    for bookie_id in held:
        cluster.faults[bookie_id].hold.add("add")
    pending = lh.add_entry_async(payload(5))
    stored_everywhere(cluster, lh, 5)
    assert not pending.done() and lh.last_add_confirmed == 4

    reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert reader.last_add_confirmed == 4
    with pytest.raises(NoSuchEntry):
        reader.read_entries(4, 5)
    assert [(e.entry_id, e.data) for e in reader.read_unconfirmed(3, 5)] == \
        [(i, payload(i)) for i in (3, 4, 5)]
    assert reader.last_add_confirmed == 4  # reading past the LAC confirms nothing
    assert reader.try_read_last_add_confirmed() == 4  # no bookie knows more

    for bookie_id in held:
        cluster.faults[bookie_id].hold.clear()
        cluster.faults[bookie_id].release()
    assert pending.result(timeout=30) == 5
    assert lh.add_entry(payload(6)) == 6  # then the idle writer's explicit LAC says 6
    wait_until(lambda: reader.try_read_last_add_confirmed() == 6, "a bookie's LAC of 6")
    assert reader.last_add_confirmed == 6
    assert [e.data for e in reader.read_entries(5, 6)] == [payload(5), payload(6)]
    lh.close()
    closed = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert closed.try_read_last_add_confirmed() == 6


def test_read_unconfirmed_stops_at_an_entry_no_bookie_holds_and_never_past_a_close(
        cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client().create_ledger(3, 2, 2, password=PASSWORD)
    for i in range(4):
        lh.add_entry(payload(i))
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    got = []
    with pytest.raises(NoSuchEntry, match="has no entry 4 on any bookie"):
        for entry in reader.read_unconfirmed(2, 6):
            got.append(entry.entry_id)
    assert got == [2, 3]  # the entries before the missing one came first
    for first, last in [(-1, 2), (3, 2)]:
        with pytest.raises(ValueError, match="bad entry range"):
            reader.read_unconfirmed(first, last)
    lh.close()
    closed = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    with pytest.raises(NoSuchEntry, match="closed at entry 3: it has no entry 4"):
        closed.read_unconfirmed(0, 4)
    assert [e.entry_id for e in closed.read_unconfirmed(0, 3)] == [0, 1, 2, 3]


def test_read_unconfirmed_and_try_read_go_on_without_a_crashed_bookie(cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client(PATIENT).create_ledger_adv(3, 3, 2, password=PASSWORD)
    for i in range(5):
        lh.add_entry(i, payload(i))
    # 6 and 7 are on every bookie, held back behind the missing 5: past the LAC.
    held_back = [lh.add_entry_async(i, payload(i)) for i in (6, 7)]
    stored_everywhere(cluster, lh, 7)
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    crashed = lh.metadata.write_set(6)[0]  # the first bookie asked for entry 6
    crash(cluster, crashed)

    assert reader.try_read_last_add_confirmed() == 4
    assert [(e.entry_id, e.data) for e in reader.read_unconfirmed(6, 7)] == \
        [(6, payload(6)), (7, payload(7))]
    with pytest.raises(BookKeeperError, match="entry 5"):  # absent on two, one silent
        list(reader.read_unconfirmed(5, 5))
    assert not any(f.done() for f in held_back)
    for bookie_id in lh.metadata.fragments[-1].ensemble:
        cluster.faults[bookie_id].unreachable = True
    with pytest.raises(BookKeeperError, match="no bookie of the last ensemble told"):
        reader.try_read_last_add_confirmed()


def test_read_unconfirmed_and_try_read_after_sigkill_of_a_bookie_process(tmp_path,
                                                                       zookeeper):
    pool = BookiePool(tmp_path, zookeeper, 3)
    try:
        with clusters(tmp_path, PROCESSES, pool) as make:
            cluster = make(3)
            lh = cluster.client(PATIENT).create_ledger_adv(3, 3, 2, password=PASSWORD)
            for i in range(3):
                lh.add_entry(i, payload(i))
            held_back = lh.add_entry_async(4, payload(4))  # carries the LAC, 2
            stored_everywhere(cluster, lh, 4)
            assert not held_back.done()  # 4 waits for 3: written, not acknowledged
            reader = cluster.client().open_ledger(lh.id, password=PASSWORD,
                                                  recovery=False)
            pool.kill(lh.metadata.write_set(4)[0])
            assert reader.try_read_last_add_confirmed() == 2
            assert [e.data for e in reader.read_unconfirmed(4, 4)] == [payload(4)]
            assert [e.entry_id for e in reader.read_unconfirmed(0, 2)] == [0, 1, 2]
    finally:
        pool.close()


# -- ledgers with caller-given entry ids ---------------------------------------------------

def test_adv_ids_out_of_order_are_acknowledged_in_order(cluster_of):
    cluster = cluster_of(4)
    bk = cluster.client()
    lh = bk.create_ledger_adv(3, 2, 2, password=PASSWORD, custom_metadata={"a": b"1"})
    assert isinstance(lh, LedgerHandleAdv)
    order = list(range(100))
    random.Random(7).shuffle(order)
    acked: list[int] = []
    lock = threading.Lock()
    all_acked = threading.Event()

    def done(entry_id, error):
        assert error is None, error
        with lock:
            acked.append(entry_id)
            if len(acked) == 100:
                all_acked.set()

    added: set[int] = set()
    for entry_id in order:
        lh.add_entry_then(entry_id, payload(entry_id), done)
        added.add(entry_id)
        # Never acknowledged past the first id not added yet.
        assert lh.last_add_confirmed < min(set(range(101)) - added)
    assert all_acked.wait(30)
    assert acked == list(range(100)) and lh.last_add_confirmed == 99
    assert [e.data for e in lh.read_entries(0, 99)] == [payload(i) for i in range(100)]
    lh.close()
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD)
    assert reader.metadata.last_entry_id == 99
    assert reader.metadata.custom_metadata == {"a": b"1"}
    assert [e.data for e in reader.read_entries(0, 99)] == [payload(i) for i in range(100)]
    for entry_id in range(100):
        assert sorted(cluster.holders(lh.id, entry_id)) == \
            sorted(reader.metadata.write_set(entry_id))


def test_adv_ids_from_many_threads_are_acknowledged_in_order(cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client().create_ledger_adv(3, 2, 2, password=PASSWORD)
    acked: list = []

    def add_every_fourth(first: int) -> None:
        for entry_id in range(first, 400, 4):
            lh.add_entry_then(entry_id, payload(entry_id),
                              lambda i, error: acked.append((i, error)))

    threads = [threading.Thread(target=add_every_fourth, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    wait_until(lambda: len(acked) == 400, "400 adds acknowledged", timeout_s=30)
    assert acked == [(i, None) for i in range(400)]
    lh.close()
    assert lh.metadata.last_entry_id == 399


def test_adv_bad_ids_are_refused_at_once_and_the_ledger_goes_on(cluster_of):
    cluster = cluster_of(3)
    bk = cluster.client(dataclasses.replace(PATIENT, advWindowEntries=8))
    lh = bk.create_ledger_adv(3, 2, 2, password=PASSWORD)
    assert lh.add_entry(0, payload(0)) == 0
    held_back = lh.add_entry_async(2, payload(2))
    with pytest.raises(InvalidEntryId, match="entry id -1 is negative"):
        lh.add_entry(-1, b"x")
    with pytest.raises(DuplicateEntryId, match="entry 0 was added already"):
        lh.add_entry(0, b"x")
    with pytest.raises(DuplicateEntryId, match="an add of entry 2 is outstanding"):
        lh.add_entry(2, b"x")
    with pytest.raises(InvalidEntryId, match="advWindowEntries=8 past the LAC 0"):
        lh.add_entry(9, b"x")
    with pytest.raises(TypeError, match="entry id must be an int"):
        lh.add_entry("1", b"x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        lh.add_entry(b"no id")  # type: ignore[call-arg]
    with pytest.raises(InvalidConfiguration, match="advWindowEntries"):
        dataclasses.replace(PATIENT, advWindowEntries=0)
    assert bk.pending_adds() == 1  # the refused adds took nothing
    edge = lh.add_entry_async(8, payload(8))  # the window's last id
    assert lh.add_entry(1, payload(1)) == 1
    assert held_back.result(timeout=30) == 2 and lh.last_add_confirmed == 2
    rest = [lh.add_entry_async(i, payload(i)) for i in range(3, 8)]
    assert [f.result(timeout=30) for f in (*rest, edge)] == list(range(3, 9))
    lh.close()
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert [e.data for e in reader.read_entries(0, 8)] == [payload(i) for i in range(9)]


def test_adv_close_fails_the_adds_held_back_behind_a_missing_id_at_once(cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client(PATIENT).create_ledger_adv(3, 2, 2, password=PASSWORD)
    lh.add_entry(0, payload(0))
    held_back = [lh.add_entry_async(i, payload(i)) for i in (2, 3)]
    stored_everywhere(cluster, lh, 3)
    returns_in_time(lh.close, "the close, with adds held back behind a missing id")
    for future in held_back:
        with pytest.raises(LedgerClosed):
            future.result(timeout=WAIT_S)
    with pytest.raises(LedgerClosed):
        lh.add_entry(1, payload(1))
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert reader.metadata.last_entry_id == 0
    with pytest.raises(NoSuchEntry):  # stored on the bookies, but past the close
        reader.read_unconfirmed(0, 2)


def test_adv_ledger_ids_chosen_by_the_caller(cluster_of):
    cluster = cluster_of(3)
    bk = cluster.client()
    taken = bk.create_ledger(3, 2, 2, password=PASSWORD).id
    with pytest.raises(LedgerExists, match=f"ledger {taken} exists already"):
        bk.create_ledger_adv(3, 2, 2, password=PASSWORD, ledger_id=taken)
    for bad in (-1, 2 ** 63, "7"):
        with pytest.raises(InvalidLedgerMetadata, match="is not an integer"):
            bk.create_ledger_adv(3, 2, 2, password=PASSWORD, ledger_id=bad)
    chosen = taken + 1_000_003  # far from the ids the store hands out in this test
    with bk.create_ledger_adv(3, 2, 2, password=PASSWORD, ledger_id=chosen) as lh:
        assert lh.id == chosen
        assert lh.add_entry(0, payload(0)) == 0
    reader = cluster.client().open_ledger(chosen, password=PASSWORD)
    assert reader.read_entry(0).data == payload(0)
    assert chosen in bk.list_ledgers()


def test_adv_a_bookie_failing_mid_window_changes_the_ensemble_and_keeps_order(cluster_of):
    cluster = cluster_of(4)
    bk = cluster.client()
    lh = bk.create_ledger_adv(3, 2, 2, password=PASSWORD)
    for i in range(10):
        lh.add_entry(i, payload(i))
    later = list(range(11, 30))
    random.Random(3).shuffle(later)
    futures = {i: lh.add_entry_async(i, payload(i)) for i in later[:10]}
    failing = lh.metadata.fragments[0].ensemble[1]
    cluster.faults[failing].unreachable = True  # fails the adds still to come
    futures.update({i: lh.add_entry_async(i, payload(i)) for i in later[10:]})
    wait_until(lambda: len(lh.metadata.fragments) == 2, "an ensemble change")
    assert lh.last_add_confirmed == 9 and not any(f.done() for f in futures.values())
    futures[10] = lh.add_entry_async(10, payload(10))  # the missing id, last
    assert [futures[i].result(timeout=30) for i in range(10, 30)] == list(range(10, 30))
    fragments = bk.ledger_manager.read(lh.id).metadata.fragments
    assert [f.first_entry_id for f in fragments] == [0, 10]  # from LAC + 1, as always
    assert failing not in fragments[1].ensemble
    lh.close()
    cluster.faults[failing].unreachable = False
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD)
    assert reader.metadata.last_entry_id == 29
    assert [e.data for e in reader.read_entries(0, 29)] == [payload(i) for i in range(30)]
    for entry_id in range(10, 30):  # every entry on its write set of the new ensemble
        assert set(fragments[1].ensemble) >= set(reader.metadata.write_set(entry_id))
        assert set(cluster.holders(lh.id, entry_id)) >= \
            set(reader.metadata.write_set(entry_id))


def test_recovery_of_an_adv_ledger_closes_before_the_first_missing_id(cluster_of):
    cluster = cluster_of(3)
    lh = cluster.client(PATIENT).create_ledger_adv(3, 3, 2, password=PASSWORD)
    for i in range(5):
        lh.add_entry(i, payload(i))
    held_back = [lh.add_entry_async(i, payload(i)) for i in (6, 7)]
    stored_everywhere(cluster, lh, 7)
    recovered = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=True)
    assert recovered.metadata.state is LedgerState.CLOSED
    assert recovered.metadata.last_entry_id == 4  # 6 and 7 are stored, but 5 is not
    with pytest.raises(NoSuchEntry):
        recovered.read_unconfirmed(4, 6)
    assert [e.data for e in recovered.read_entries(0, 4)] == [payload(i) for i in range(5)]
    with pytest.raises(LedgerFenced):  # the old writer learns it lost the ledger
        lh.add_entry(5, payload(5))
    for future in held_back:
        with pytest.raises((LedgerFenced, LedgerClosed)):
            future.result(timeout=WAIT_S)
    lh.close()  # at its LAC, 4: agrees with recovery


def test_recovery_of_an_adv_ledger_keeps_what_follows_a_late_id(cluster_of):
    """The missing id reached one bookie before the writer died: recovery finds it, and
    then the entries above it, and closes past them all."""
    cluster = cluster_of(3)
    lh = cluster.client(PATIENT).create_ledger_adv(3, 3, 2, password=PASSWORD)
    for i in range(5):
        lh.add_entry(i, payload(i))
    held_back = [lh.add_entry_async(i, payload(i)) for i in (6, 7)]
    stored_everywhere(cluster, lh, 7)
    others = lh.metadata.write_set(5)[1:]
    for bookie_id in others:
        cluster.faults[bookie_id].drop.add("add")
    late = lh.add_entry_async(5, payload(5))
    wait_until(lambda: cluster.holders(lh.id, 5) == [lh.metadata.write_set(5)[0]],
               "entry 5 on one bookie")
    for bookie_id in others:
        cluster.faults[bookie_id].drop.clear()
    recovered = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=True)
    assert recovered.metadata.last_entry_id == 7
    assert [e.data for e in recovered.read_entries(0, 7)] == [payload(i) for i in range(8)]
    for entry_id in (5, 6, 7):  # re-written to their whole write sets
        assert sorted(cluster.holders(lh.id, entry_id)) == \
            sorted(recovered.metadata.write_set(entry_id))
    with pytest.raises((LedgerFenced, LedgerClosed)):
        lh.add_entry(8, payload(8))
    assert not any(f.done() and f.exception() is None for f in (late, *held_back))


# -- adv ledgers with deferred sync ---------------------------------------------------

def test_adv_deferred_adds_force_up_to_the_lac_in_id_order(cluster_of):
    """``create_ledger_adv(write_flags={DEFERRED_SYNC})``, as BookKeeper allows: adds
    acknowledged in id order before they are synced, a force making everything up to the
    LAC durable (never the ids held back above a missing one), readers seeing only the
    durable LAC, close forcing first."""
    cluster = cluster_of(3)
    lh = cluster.client(PATIENT).create_ledger_adv(3, 2, 2, password=PASSWORD,
                                                   write_flags={WriteFlag.DEFERRED_SYNC})
    order = list(range(10))
    random.Random(3).shuffle(order)
    futures = {i: lh.add_entry_async(i, payload(i)) for i in order}
    assert [futures[i].result(timeout=30) for i in range(10)] == list(range(10))
    assert lh.last_add_acknowledged == 9
    assert lh.last_add_forced == lh.last_add_confirmed == -1
    reader = cluster.client().open_ledger(lh.id, password=PASSWORD, recovery=False)
    assert reader.read_last_add_confirmed() == -1  # nothing is durable yet
    held_back = lh.add_entry_async(11, payload(11))  # 10 is missing
    stored_everywhere(cluster, lh, 11)
    assert lh.force() == 9 == lh.last_add_confirmed
    assert lh.add_entry(10, payload(10)) == 10
    assert held_back.result(timeout=30) == 11
    assert lh.last_add_acknowledged == 11 and lh.last_add_forced == 9
    # Idle again, the writer sends the durable LAC (explicit LAC), not the acknowledged.
    wait_until(lambda: reader.read_last_add_confirmed() == 9, "the durable LAC read")
    assert [e.data for e in reader.read_entries(0, 9)] == [payload(i) for i in range(10)]
    lh.close()  # forces first: the two last acknowledged ids are in the closed ledger
    assert lh.metadata.state is LedgerState.CLOSED and lh.metadata.last_entry_id == 11
    with pytest.raises(LedgerClosed):
        lh.force()
    recovered = cluster.client().open_ledger(lh.id, password=PASSWORD)
    assert [e.data for e in recovered.read_entries(0, 11)] == [payload(i) for i in range(12)]


def test_adv_deferred_ledger_closes_at_the_durable_lac_when_a_bookie_fails(cluster_of):
    """No ensemble change for a DEFERRED_SYNC adv ledger either: a failing bookie closes
    it at the durable LAC, without the ids acknowledged after the last force."""
    cluster = cluster_of(4)
    bk = cluster.client(PATIENT)
    lh = bk.create_ledger_adv(3, 3, 2, password=PASSWORD,
                              write_flags={WriteFlag.DEFERRED_SYNC})
    ensemble = lh.metadata.fragments[0].ensemble
    for i in (1, 0, 3, 2):
        lh.add_entry_async(i, payload(i))
    wait_until(lambda: lh.last_add_acknowledged == 3, "ids 0..3 acknowledged")
    assert lh.force() == 3
    for i in (5, 4):
        lh.add_entry_async(i, payload(i))
    wait_until(lambda: lh.last_add_acknowledged == 5, "ids 4..5 acknowledged")
    cluster.faults[ensemble[0]].fail.add("add")
    with pytest.raises(BookKeeperError):
        lh.add_entry(6, payload(6))
    wait_until(lambda: bk.ledger_manager.read(lh.id).metadata.state is LedgerState.CLOSED,
               "the ledger closed")
    closed = bk.ledger_manager.read(lh.id).metadata
    assert closed.last_entry_id == 3 and closed.fragments[0].ensemble == ensemble
    assert len(closed.fragments) == 1
    with pytest.raises(ValueError, match="WriteFlag"):
        bk.create_ledger_adv(3, 2, 2, password=PASSWORD, write_flags={"DEFERRED_SYNC"})
