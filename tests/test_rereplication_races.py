"""A repair's metadata update racing other updates, made deterministic: in-process
bookies and the metadata writes held and released in the order a test needs
(``FaultyMetadataStore.hold_writes``, as in tests/test_ledger_races.py); and copies
taken from another replica when one fails to read or holds a bad copy.

The ledger: E=3, Qw=2 on three of four bookies; a bookie of it fails, its writer
replaces it by the fourth (an ensemble change at entry 6) and goes on, and the bookie
leaves the registry for good.  Its entries of the first fragment (0..5) are what a
repair copies to a replacement, which can only be the fourth bookie.
"""

from __future__ import annotations

import threading

import pytest
from clientutil import FAST, clusters
from test_ledger_races import Background, payload

from pybk.autorecovery.replicas import holds
from pybk.autorecovery.rereplication import LedgerRepair, Outcome
from pybk.client.digest import DigestManager
from pybk.errors import NoSuchEntry, NoSuchLedger
from pybk.meta.ledger_metadata import LedgerState
from pybk.settings import ServerSettings

pytestmark = pytest.mark.timeout(60)

PASSWORD = b"repair-race"
SETTINGS = ServerSettings(bookieRecoveryPasswd=PASSWORD.decode())


@pytest.fixture
def changed_ledger(tmp_path):
    """The cluster, a client, the ledger's open handle and the lost bookie (see the
    module docstring)."""
    with clusters(tmp_path) as make:
        cluster = make(4)
        bk = cluster.client(FAST)
        for bookie_id in cluster.bookie_ids:
            cluster.store.register_bookie(bookie_id)
        handle = bk.create_ledger(3, 2, 2, password=PASSWORD)
        for entry_id in range(6):
            handle.add_entry(payload(entry_id))
        lost = handle.metadata.fragments[0].ensemble[0]
        cluster.faults[lost].unreachable = True
        handle.add_entry(payload(6))  # after the writer replaced the lost bookie
        assert lost not in handle.metadata.fragments[-1].ensemble
        cluster.store.unregister_bookie(lost)
        yield cluster, bk, handle, lost


def repair_in_background(bk, ledger_id: int, lost: str) -> Background:
    repair = LedgerRepair(bk, SETTINGS, threading.Event())
    return Background(lambda: repair.run(ledger_id, (lost,), writer_grace_over=False),
                      f"repair-{ledger_id}")


def check_copies(cluster, metadata, lost_index: int) -> None:
    """Entries 0..5 are on both bookies of their write sets in ``metadata``; the
    replacement holds exactly the lost bookie's share of them."""
    digest = DigestManager(metadata.ledger_id, metadata.digest_type, PASSWORD)
    replacement = metadata.fragments[0].ensemble[lost_index]
    for entry_id in range(6):
        for bookie_id in metadata.write_set(entry_id):
            data = cluster.stored_entry(bookie_id, metadata.ledger_id, entry_id)
            assert digest.decode(entry_id, data).data == payload(entry_id)
        if not holds(metadata, lost_index, entry_id) and \
                replacement not in metadata.write_set(entry_id):
            with pytest.raises((NoSuchEntry, NoSuchLedger)):
                cluster.stored_entry(replacement, metadata.ledger_id, entry_id)


def test_a_repair_that_loses_the_race_to_the_writers_close_reads_again_and_keeps_both(
        changed_ledger):
    cluster, bk, handle, lost = changed_ledger
    index = handle.metadata.fragments[0].ensemble.index(lost)
    faults = cluster.metadata_faults
    faults.hold_writes = True
    repair = repair_in_background(bk, handle.id, lost)
    (ours,) = faults.wait_held(1)             # copies done, the ensemble's update held
    closing = Background(handle.close, "writer-close")
    theirs = faults.wait_held(2)[1]
    faults.release(theirs)                    # the writer's close lands first
    closing.join()
    faults.release(ours)                      # ours fails its compare-and-set...
    retried = faults.wait_held(1)[0]          # ...and is made again on what is there now
    faults.release(retried)
    faults.hold_writes = False
    repair.join()
    assert repair.error is None and repair.result.outcome is Outcome.REPLICATED
    assert repair.result.entries == sum(holds(handle.metadata, index, e) for e in range(6))
    metadata = bk.ledger_manager.read(handle.id).metadata
    assert metadata.state is LedgerState.CLOSED and metadata.last_entry_id == 6
    assert metadata.fragments[1] == handle.metadata.fragments[1]   # the writer's
    assert lost not in metadata.fragments[0].ensemble               # the repair's
    check_copies(cluster, metadata, index)


def test_of_two_repairs_racing_only_one_is_recorded(changed_ledger):
    cluster, bk, handle, lost = changed_ledger
    handle.close()
    index = handle.metadata.fragments[0].ensemble.index(lost)
    faults = cluster.metadata_faults
    faults.hold_writes = True
    first = repair_in_background(bk, handle.id, lost)
    faults.wait_held(1)
    second = repair_in_background(bk, handle.id, lost)
    held = faults.wait_held(2)
    faults.release(held[0])
    first.join()
    faults.release(held[1])  # finds the lost bookie replaced already: records nothing
    faults.hold_writes = False
    second.join()
    assert first.error is None and second.error is None
    metadata = bk.ledger_manager.read(handle.id).metadata
    assert lost not in metadata.fragments[0].ensemble
    assert faults.held() == []
    check_copies(cluster, metadata, index)


def test_copies_come_from_another_replica_when_one_fails_or_holds_a_bad_copy(tmp_path,
                                                                             caplog):
    with clusters(tmp_path) as make:
        cluster = make(4)
        bk = cluster.client(FAST)
        for bookie_id in cluster.bookie_ids:
            cluster.store.register_bookie(bookie_id)
        handle = bk.create_ledger(3, 3, 2, password=PASSWORD)  # two survivors per entry
        for entry_id in range(4):
            handle.add_entry(payload(entry_id))
        handle.close()
        metadata = handle.metadata
        lost = metadata.fragments[0].ensemble[0]
        cluster.faults[lost].unreachable = True
        cluster.store.unregister_bookie(lost)
        first_source = [b for b in metadata.write_set(1) if b != lost][0]
        cluster.faults[first_source].fail = {"read"}    # entry 1: its first source fails
        cluster.faults[first_source].only_entries = {1}
        bad_source = [b for b in metadata.write_set(2) if b != lost][0]
        good = cluster.stored_entry(bad_source, handle.id, 2)
        cluster.put_entry(bad_source, handle.id, 2, good[:-1] + bytes([good[-1] ^ 1]),
                          bk.master_key(PASSWORD))      # entry 2: a bad copy first
        assert cluster.stored_entry(bad_source, handle.id, 2) != good
        repair = LedgerRepair(bk, SETTINGS, threading.Event())
        result = repair.run(handle.id, (lost,), writer_grace_over=False)
        assert result.outcome is Outcome.REPLICATED and result.entries == 4
        assert f"ledger {handle.id} entry 2: bad copy on {bad_source}" in caplog.text
        repaired = bk.ledger_manager.read(handle.id).metadata
        replacement = repaired.fragments[0].ensemble[0]
        digest = DigestManager(handle.id, metadata.digest_type, PASSWORD)
        for entry_id in range(4):
            data = cluster.stored_entry(replacement, handle.id, entry_id)
            assert digest.decode(entry_id, data).data == payload(entry_id)
