"""A repair's copy, pipelined (:mod:`pybk.autorecovery.rereplication`): several batch
reads in flight at once, within ``rereplicationMaxBytesInFlight``; the adds to the
replacement grouped (an answer per ADD message, no Future per add); and a failure in
the middle of the pipeline (a read, an add refused, the replacement dying) leaving the
ledger unrepaired, its metadata still naming the lost bookie, so that a second run
copies exactly the lost entries.

Bookie servers on loopback TCP (READ_BATCH and ADD messages over ZeroMQ), the fault
hooks between the repair's client and each bookie.  The ledger: E=3, Qw=2 on three of
four bookies, closed; its first bookie is lost, so its share (two entries in three) is
copied to the fourth, asked of the two survivors: a batch is two READ_BATCH requests.
"""

from __future__ import annotations

import threading

import pytest
from clientutil import FAST, clusters, spy_on
from test_ledger_races import Background

from pybk.autorecovery.replicas import holds
from pybk.autorecovery.rereplication import LedgerRepair, Outcome
from pybk.client.digest import DigestManager
from pybk.client.reads import READ_BATCH_MAX_BYTES
from pybk.errors import BookKeeperError, NoSuchEntry, NoSuchLedger
from pybk.settings import ServerSettings
from pybk.testing import WAIT_S, wait_until

pytestmark = pytest.mark.timeout(120)

PASSWORD = b"pipelined"
ENTRIES = 300
BATCH = 20  # entries of the lost bookie's share per batch: 10 batches in all
#: Three batches' read budgets (two requests each): the reads a copy keeps in flight.
BOUND = 6 * READ_BATCH_MAX_BYTES


def payload(entry_id: int) -> bytes:
    return b"%d:" % entry_id + bytes(200)


def repair_of(bk) -> LedgerRepair:
    return LedgerRepair(bk, ServerSettings(bookieRecoveryPasswd=PASSWORD.decode(),
                                           rereplicationEntryBatchSize=BATCH,
                                           rereplicationMaxBytesInFlight=BOUND),
                        threading.Event())


@pytest.fixture
def lost_bookie(tmp_path, request):
    """The cluster, a client, the closed ledger's metadata, the lost bookie, its share
    and the replacement (see the module docstring; the write quorum is 2 unless the
    test's indirect parameter gives another)."""
    write_quorum = getattr(request, "param", 2)
    with clusters(tmp_path, "zmq") as make:
        cluster = make(4)
        for bookie_id in cluster.bookie_ids:
            cluster.store.register_bookie(bookie_id)
        handle = cluster.client(FAST).create_ledger(3, write_quorum, 2, password=PASSWORD)
        for add in [handle.add_entry_async(payload(i)) for i in range(ENTRIES)]:
            add.result(timeout=30)
        handle.close()
        metadata = handle.metadata
        lost = metadata.fragments[0].ensemble[0]
        share = [e for e in range(ENTRIES) if holds(metadata, 0, e)]
        (replacement,) = set(cluster.bookie_ids) - set(metadata.fragments[0].ensemble)
        cluster.faults[lost].unreachable = True
        cluster.store.unregister_bookie(lost)
        yield cluster, cluster.client(FAST), metadata, lost, share, replacement


def stores(cluster, bookie_id: str, ledger_id: int, entry_id: int) -> bool:
    try:
        cluster.stored_entry(bookie_id, ledger_id, entry_id)
    except (NoSuchEntry, NoSuchLedger):
        return False
    return True


def held_on(cluster, bookie_id: str, ledger_id: int) -> set[int]:
    """The entries of the ledger the bookie stores."""
    return {e for e in range(ENTRIES) if stores(cluster, bookie_id, ledger_id, e)}


def check_repaired(cluster, bk, metadata, lost, share, replacement) -> None:
    """The metadata names the replacement in the lost bookie's place, and it holds
    exactly the lost bookie's share, as written."""
    repaired = bk.ledger_manager.read(metadata.ledger_id).metadata
    assert repaired.fragments[0].ensemble == (replacement,) + metadata.fragments[0].ensemble[1:]
    assert held_on(cluster, replacement, metadata.ledger_id) == set(share)
    digest = DigestManager(metadata.ledger_id, metadata.digest_type, PASSWORD)
    for entry_id in share:
        data = cluster.stored_entry(replacement, metadata.ledger_id, entry_id)
        assert digest.decode(entry_id, data).data == payload(entry_id)


def test_batches_are_read_ahead_within_the_bound_and_written_in_grouped_adds(lost_bookie):
    cluster, bk, metadata, lost, share, replacement = lost_bookie
    sources = [b for b in metadata.fragments[0].ensemble if b != lost]
    spies, counter = spy_on(bk, cluster)
    for bookie_id in sources:
        cluster.faults[bookie_id].hold.add("read_batch")
    repair = Background(lambda: repair_of(bk).run(metadata.ledger_id, (lost,), False),
                        "repair")
    # No read is answered yet, so the copy asked these at once: three batches ahead.
    wait_until(lambda: sum(len(cluster.faults[b].held()) for b in sources) == 6,
               "three batches (six READ_BATCH requests) in flight")
    assert not spies[replacement].answered  # nothing written before an answer
    for bookie_id in sources:
        cluster.faults[bookie_id].hold.clear()
        cluster.faults[bookie_id].release()
    repair.join()
    assert repair.error is None, repair.error
    assert repair.result == (Outcome.REPLICATED, len(share),
                             sum(len(cluster.stored_entry(replacement, metadata.ledger_id, e))
                                 for e in share))
    # Never more requests in flight than the bound's budgets allow.
    assert counter["most"] == 6
    # The adds: no Future each, and each answer of the replacement covers a batch's adds
    # (one ADD message; a batch whose adds were queued while another's answer came may
    # be cut in two).
    target = spies[replacement]
    assert target.future_adds == 0
    assert sum(target.answered) == len(share)
    assert len(target.answered) <= 2 * len(share) // BATCH
    check_repaired(cluster, bk, metadata, lost, share, replacement)


def fail_reads(cluster, metadata, lost, entry_id: int) -> None:
    for bookie_id in metadata.write_set(entry_id):
        if bookie_id != lost:
            cluster.faults[bookie_id].fail.add("read")
            cluster.faults[bookie_id].only_entries = {entry_id}


def refuse_add(cluster, replacement, entry_id: int) -> None:
    cluster.faults[replacement].fail.add("add")
    cluster.faults[replacement].only_entries = {entry_id}


@pytest.mark.parametrize("failure", ["read", "add"])
def test_a_failure_in_the_middle_leaves_the_ledger_unrepaired_and_a_second_run_completes_it(
        lost_bookie, failure):
    cluster, bk, metadata, lost, share, replacement = lost_bookie
    middle = share[len(share) // 2]  # in the sixth batch of ten
    if failure == "read":
        fail_reads(cluster, metadata, lost, middle)
    else:
        refuse_add(cluster, replacement, middle)
    repair = repair_of(bk)
    with pytest.raises(BookKeeperError, match=f"entry {middle}"):
        repair.run(metadata.ledger_id, (lost,), False)
    assert bk.ledger_manager.read(metadata.ledger_id).metadata.fragments == metadata.fragments
    assert not stores(cluster, replacement, metadata.ledger_id, middle)
    # The first batch was copied (its adds may still be on their way: they land).
    wait_until(lambda: stores(cluster, replacement, metadata.ledger_id, share[0]),
               "the first batch copied")
    for faults in cluster.faults.values():
        faults.fail.clear()
        faults.only_entries = None
    result = repair.run(metadata.ledger_id, (lost,), False)
    assert (result.outcome, result.entries) == (Outcome.REPLICATED, len(share))
    check_repaired(cluster, bk, metadata, lost, share, replacement)


def test_the_replacement_dying_in_the_middle_leaves_the_ledger_unrepaired(lost_bookie):
    cluster, bk, metadata, lost, share, replacement = lost_bookie
    sources = [b for b in metadata.fragments[0].ensemble if b != lost]
    for bookie_id in sources:
        cluster.faults[bookie_id].hold.add("read_batch")
    repair = repair_of(bk)
    running = Background(lambda: repair.run(metadata.ledger_id, (lost,), False), "repair")
    wait_until(lambda: sum(len(cluster.faults[b].held()) for b in sources) == 6,
               "three batches in flight")
    for bookie_id in sources:  # the first three batches are read, then copied
        cluster.faults[bookie_id].release()
    third = share[3 * BATCH - 1]
    wait_until(lambda: stores(cluster, replacement, metadata.ledger_id, third),
               "three batches copied")
    cluster.stop_bookie(replacement)
    for bookie_id in sources:
        cluster.faults[bookie_id].hold.clear()
        cluster.faults[bookie_id].release()
    running.join()
    assert isinstance(running.error, BookKeeperError), running.error
    assert bk.ledger_manager.read(metadata.ledger_id).metadata.fragments == metadata.fragments
    cluster.restart_bookie(replacement)
    wait_until(lambda: _answers(bk, replacement, metadata.ledger_id),
               "the client reaches the restarted replacement")
    result = repair.run(metadata.ledger_id, (lost,), False)
    assert (result.outcome, result.entries) == (Outcome.REPLICATED, len(share))
    check_repaired(cluster, bk, metadata, lost, share, replacement)


def _answers(bk, bookie_id: str, ledger_id: int) -> bool:
    try:
        bk.bookie_client(bookie_id).read_lac(ledger_id).result(timeout=WAIT_S)
    except BookKeeperError:
        return False
    return True


@pytest.mark.parametrize("lost_bookie", [3], indirect=True)  # two survivors an entry
def test_a_source_whose_batch_read_failed_is_asked_last_for_the_entries_it_did_not_answer(
        lost_bookie):
    # One source never answers batch reads (a hung bookie: each request waits
    # readTimeout).  The entries of its requests already in flight are read from the other
    # replica, not asked of it again one by one (each single read would wait readTimeout
    # too, one entry after the other); its single reads fail at once here, so that asking
    # it shows as a read it recorded rather than as minutes spent.
    cluster, bk, metadata, lost, share, replacement = lost_bookie
    hung = next(b for b in metadata.fragments[0].ensemble if b != lost)
    cluster.faults[hung].drop.add("read_batch")
    cluster.faults[hung].fail.add("read")
    spies, _counter = spy_on(bk, cluster)
    result = repair_of(bk).run(metadata.ledger_id, (lost,), False)
    assert (result.outcome, result.entries) == (Outcome.REPLICATED, len(share))
    assert spies[hung].reads == []
    check_repaired(cluster, bk, metadata, lost, share, replacement)


def test_an_add_never_answered_leaves_the_ledger_unrepaired(lost_bookie):
    # The replacement takes every add but one, whose answer is lost: the copy fails
    # once nothing was answered for addEntryTimeout, the metadata unchanged.
    cluster, bk, metadata, lost, share, replacement = lost_bookie
    middle = share[len(share) // 2]
    cluster.faults[replacement].drop.add("add")
    cluster.faults[replacement].only_entries = {middle}
    with pytest.raises(BookKeeperError, match=fr"bookie {replacement} .*\(entries \[{middle}\]"):
        repair_of(bk).run(metadata.ledger_id, (lost,), False)
    assert bk.ledger_manager.read(metadata.ledger_id).metadata.fragments == metadata.fragments
    assert held_on(cluster, replacement, metadata.ledger_id) == set(share) - {middle}


def test_entries_over_a_batch_reads_budget_are_copied_whole(tmp_path):
    # Entries larger than READ_BATCH_MAX_BYTES: a batch read brings one at most (the
    # rest are read one by one), and the bound (here below one entry) still lets the
    # copy through, one batch at a time.
    big = READ_BATCH_MAX_BYTES + 1000
    with clusters(tmp_path, "zmq") as make:
        cluster = make(4)
        for bookie_id in cluster.bookie_ids:
            cluster.store.register_bookie(bookie_id)
        handle = cluster.client(FAST).create_ledger(3, 2, 2, password=PASSWORD)
        payloads = [bytes([i]) * (big if i % 2 else 100) for i in range(12)]
        for add in [handle.add_entry_async(p) for p in payloads]:
            add.result(timeout=30)
        handle.close()
        metadata = handle.metadata
        lost = metadata.fragments[0].ensemble[0]
        (replacement,) = set(cluster.bookie_ids) - set(metadata.fragments[0].ensemble)
        cluster.faults[lost].unreachable = True
        cluster.store.unregister_bookie(lost)
        bk = cluster.client(FAST)
        repair = LedgerRepair(bk, ServerSettings(bookieRecoveryPasswd=PASSWORD.decode(),
                                                 rereplicationEntryBatchSize=4,
                                                 rereplicationMaxBytesInFlight=big // 2),
                              threading.Event())
        result = repair.run(metadata.ledger_id, (lost,), False)
        share = [e for e in range(12) if holds(metadata, 0, e)]
        assert (result.outcome, result.entries) == (Outcome.REPLICATED, len(share))
        digest = DigestManager(metadata.ledger_id, metadata.digest_type, PASSWORD)
        for entry_id in share:
            data = cluster.stored_entry(replacement, metadata.ledger_id, entry_id)
            assert digest.decode(entry_id, data).data == payloads[entry_id]
