"""Replication workers on a real cluster: ``pybk bookie`` processes on the session's
real ZooKeeper, bookies killed with SIGKILL, and workers in the bookie processes or in
this process (:class:`AutoRecovery`, whose :attr:`~AutoRecovery.worker` counts what it
copied).

A repair is checked on the bookies themselves: every entry of every ledger is read from
every bookie of its write set in the new metadata, one bookie at a time, its digest
verified and its payload compared with what was written.  Waits are bounded; where "not
yet" is checked, the test first waits for the worker to have looked (its log, or its
loop's passes).
"""

from __future__ import annotations

import logging

import pytest
import zkutil
from autorecoveryutil import (  # noqa: F401 (a fixture)
    FAST,
    check_replicas,
    cluster,
    entries_on,
    expected_marks,
    full_log,
    marks,
    repaired,
    write_ledger,
)
from clusterutil import PASSWORD, Writer, address, bookies, payload  # noqa: F401

import pybk
from pybk.autorecovery.replicas import bookie_holds_entries, holds
from pybk.autorecovery.service import AutoRecovery
from pybk.client import BookKeeper
from pybk.meta.ledger_metadata import DigestType, LedgerState
from pybk.meta.zookeeper import ZooKeeperMetadataStore
from pybk.settings import ServerSettings
from pybk.testing import wait_until

pytestmark = pytest.mark.timeout(240)

SHORT_MS = zkutil.SHORT_SESSION_TIMEOUT_MS
#: What the workers of these tests are set to: the tests' ledger password, a writer's
#: grace long enough for an ensemble change on a busy machine, short back-offs.
WORKER_SETTINGS = {"bookieRecoveryPasswd": PASSWORD.decode(),
                   "openLedgerRereplicationGracePeriod": 10_000,
                   "lockReleaseOfFailedLedgerGracePeriod": 3_200}
WORKER_OPTIONS = tuple(option for key, value in WORKER_SETTINGS.items()
                       for option in ("--set", f"{key}={value}"))
#: Bookies that leave repair to the workers of this process.
NO_AUTORECOVERY = ("--set", "autoRecoveryDaemonEnabled=false")


def workers(closing, address: str, names: list[str], **settings_given) -> list[AutoRecovery]:
    """Autorecovery (auditor candidate and worker) in this process, one per name, each on
    a ZooKeeper session of its own, with WORKER_SETTINGS and ``settings_given``."""
    settings = ServerSettings(**{**WORKER_SETTINGS, **settings_given})
    return [closing.enter_context(AutoRecovery(
        closing.enter_context(ZooKeeperMetadataStore(address, zkutil.settings())),
        settings, name)) for name in names]


# -- a bookie lost for good --------------------------------------------------------------------

def test_every_ledger_is_fully_replicated_again_after_a_bookie_is_lost(bookies, cluster):
    processes = bookies.start_serving(5, zk_timeout_ms=SHORT_MS, options=WORKER_OPTIONS)
    bk, manager = cluster
    closed = [write_ledger(bk, 3, qw, entries=12) for qw in (2, 2, 3, 3)]
    handle = bk.create_ledger(3, 2, 2, password=PASSWORD)
    writer = Writer(handle, window=8)
    try:
        writer.wait_for(20)
        # The victim holds entries of the open ledger's last fragment: its writer must
        # replace it, and the workers copy what it held before.
        victim_id = handle.metadata.fragments[-1].ensemble[0]
        expected = expected_marks(bk, victim_id)
        assert handle.id in expected
        next(p for p in processes if p.bookie_id == victim_id).kill()
        wait_until(lambda: repaired(bk, manager, victim_id),
                   f"every ledger of {victim_id} repaired", timeout_s=120)
        writer.wait_for(20)  # the writer went on writing
    finally:
        acked = writer.stop()
    handle.close()
    assert acked == list(range(len(acked)))
    assert handle.metadata.last_entry_id >= acked[-1]
    for ledger in closed + [handle]:
        metadata = bk.ledger_manager.read(ledger.id).metadata
        assert metadata.state is LedgerState.CLOSED
        assert not bookie_holds_entries(metadata, victim_id)
        check_replicas(bk, metadata, metadata.last_entry_id)


def test_two_workers_share_the_work_and_copy_only_the_lost_bookies_entries(
        bookies, cluster, closing, address):
    processes = bookies.start_serving(4, zk_timeout_ms=SHORT_MS, options=NO_AUTORECOVERY)
    bk, manager = cluster
    ledgers = [write_ledger(bk, 3, 2, entries=9) for _ in range(6)]
    pair = workers(closing, address, ["worker-a", "worker-b"])
    victim_id = ledgers[0].metadata.fragments[0].ensemble[0]
    before = {lh.id: lh.metadata for lh in ledgers}
    expected = expected_marks(bk, victim_id)
    next(p for p in processes if p.bookie_id == victim_id).kill()
    wait_until(lambda: repaired(bk, manager, victim_id), f"the ledgers of {victim_id} "
               "repaired")
    copied = 0
    for ledger_id, old in before.items():
        new = bk.ledger_manager.read(ledger_id).metadata
        check_replicas(bk, new, new.last_entry_id)
        if ledger_id not in expected:
            assert new.fragments == old.fragments
            continue
        index = old.fragments[0].ensemble.index(victim_id)
        replacement = new.fragments[0].ensemble[index]
        assert replacement not in old.fragments[0].ensemble
        # The replacement holds exactly the entries the lost bookie held: E=3, Qw=2, so
        # two thirds of them, not the whole fragment.
        held = entries_on(bk, replacement, new)
        assert set(held) == {e for e in range(new.last_entry_id + 1) if holds(new, index, e)}
        assert len(held) < new.last_entry_id + 1
        copied += sum(held.values())
    stats = [service.worker.stats for service in pair]
    assert sum(s.ledgers_replicated for s in stats) == len(expected)  # each one once
    assert sum(s.bytes_copied for s in stats) == copied


def test_a_ledger_stays_marked_while_too_few_bookies_and_completes_when_one_joins(
        bookies, cluster):
    processes = bookies.start_serving(3, zk_timeout_ms=SHORT_MS, options=WORKER_OPTIONS)
    bk, manager = cluster
    ledger = write_ledger(bk, 3, 3, entries=6)
    victim = processes[0]
    victim.kill()
    # Every live bookie's worker may have tried it; one of them says it could not.
    wait_until(lambda: any(f"ledger {ledger.id} cannot be re-replicated yet" in full_log(p)
                           for p in processes[1:]), "a worker finds too few bookies")
    assert ledger.id in marks(manager)
    assert bk.ledger_manager.read(ledger.id).metadata.fragments == ledger.metadata.fragments
    joined = bookies.start("bookie4", *WORKER_OPTIONS, zk_timeout_ms=SHORT_MS).wait_serving()
    wait_until(lambda: repaired(bk, manager, victim.bookie_id), "repaired once one joins")
    metadata = bk.ledger_manager.read(ledger.id).metadata
    assert joined.bookie_id in metadata.fragments[0].ensemble
    check_replicas(bk, metadata, metadata.last_entry_id)


def test_workers_of_rack_aware_bookies_put_a_lost_copy_on_its_rack(bookies, cluster,
                                                                    address):
    racks = {"B1": "/east/r1", "B2": "/east/r2", "B3": "/west/r3", "B4": "/east/r1",
             "B5": "/east/r2"}
    placement = {"ensemblePlacementPolicy": "rackaware", "minNumRacksPerWriteQuorum": 3,
                 "enforceMinNumRacksPerWriteQuorum": True}
    started = [bookies.start(bookie_id, "--bookie-id", bookie_id, *WORKER_OPTIONS,
                             "--set", f"bookieNetworkLocation={rack}",
                             *(option for key, value in placement.items()
                               for option in ("--set", f"{key}={str(value).lower()}")),
                             zk_timeout_ms=SHORT_MS)
               for bookie_id, rack in racks.items()]
    processes = {p.bookie_id: p for p in (p.wait_serving() for p in started)}
    bk, manager = cluster
    with pybk.connect(address, FAST.replace(**placement),
                      zk_settings=zkutil.settings()) as writer:
        ledger = next(lh for lh in (write_ledger(writer, 3, 3, entries=6) for _ in range(20))
                      if "B1" in lh.metadata.fragments[0].ensemble)
    assert "B4" not in ledger.metadata.fragments[0].ensemble  # three racks: B1 or B4
    processes["B1"].kill()
    wait_until(lambda: repaired(bk, manager, "B1"), "the ledgers of B1 repaired")
    metadata = bk.ledger_manager.read(ledger.id).metadata
    assert metadata.fragments[0].ensemble == tuple(
        "B4" if b == "B1" else b for b in ledger.metadata.fragments[0].ensemble)
    # B4 holds what B1 held (with E = Qw = 3, every entry), as written: the worker's
    # copies.  The other two copies are the writer's, which promise less: an entry is
    # acknowledged by Qa = 2 bookies, and the writer's client closed with the third copy
    # of its last entries perhaps still queued for a slow bookie, never sent.
    check_replicas(bk, metadata, metadata.last_entry_id, on={"B4"})


def test_an_open_ledger_whose_writer_is_gone_is_fenced_closed_and_replicated(
        bookies, cluster, closing, address):
    processes = bookies.start_serving(4, zk_timeout_ms=SHORT_MS, options=NO_AUTORECOVERY)
    bk, manager = cluster
    # Its writer's client ends without closing it, as a writer that died would.
    with pybk.connect(address, FAST, zk_settings=zkutil.settings()) as gone:
        abandoned = write_ledger(gone, 3, 2, entries=7, close=False)
    (service,) = workers(closing, address, ["worker"],
                         openLedgerRereplicationGracePeriod=500)
    victim_id = abandoned.metadata.fragments[0].ensemble[1]
    next(p for p in processes if p.bookie_id == victim_id).kill()
    wait_until(lambda: repaired(bk, manager, victim_id), "the open ledger repaired")
    metadata = bk.ledger_manager.read(abandoned.id).metadata
    assert metadata.state is LedgerState.CLOSED and metadata.last_entry_id == 6
    check_replicas(bk, metadata, metadata.last_entry_id)
    assert service.worker.stats.ledgers_replicated == 1


def test_a_writer_that_replaces_the_lost_bookie_within_its_grace_keeps_its_ledger(
        bookies, cluster, closing, address, caplog):
    caplog.set_level(logging.INFO, logger="pybk.autorecovery.worker")
    processes = bookies.start_serving(4, zk_timeout_ms=SHORT_MS, options=NO_AUTORECOVERY)
    bk, manager = cluster
    handle = write_ledger(bk, 3, 2, entries=5, close=False)  # its writer idles
    # A grace longer than the test's waits: only the writer's change can end it.
    workers(closing, address, ["worker"], openLedgerRereplicationGracePeriod=600_000)
    victim_id = handle.metadata.fragments[0].ensemble[0]
    next(p for p in processes if p.bookie_id == victim_id).kill()
    wait_until(lambda: f"ledger {handle.id} is open and its last fragment lost a bookie"
               in caplog.text, "the worker waits for the writer")
    handle.add_entry(payload(5))  # fails on the lost bookie: an ensemble change
    wait_until(lambda: repaired(bk, manager, victim_id), "repaired after the writer's change")
    handle.add_entry(payload(6))  # neither fenced nor closed
    handle.close()
    metadata = bk.ledger_manager.read(handle.id).metadata
    assert metadata.last_entry_id == 6
    check_replicas(bk, metadata, 6)


# -- marks without repair --------------------------------------------------------------------

def deleted_ledger(bk: BookKeeper) -> int:
    """The id of a ledger that was created (its metadata only) and deleted."""
    ledger_id = bk.ledger_manager.create_ledger(["gone:1"], 1, 1, DigestType.CRC32C,
                                                PASSWORD).metadata.ledger_id
    bk.ledger_manager.delete(ledger_id)
    return ledger_id


def test_the_mark_of_a_deleted_ledger_is_cleared(cluster, closing, address):
    bk, manager = cluster
    (service,) = workers(closing, address, ["worker"])
    ledger_id = deleted_ledger(bk)
    manager.mark_underreplicated(ledger_id, ["gone:1"])
    # The worker counts the ledger just after it clears the mark.
    wait_until(lambda: not marks(manager) and service.worker.stats.ledgers_deleted == 1,
               "the mark cleared")
    assert service.worker.stats.ledgers_replicated == 0


def test_the_disable_flag_holds_repair_until_enabled(cluster, closing, address):
    bk, manager = cluster
    manager.disable()
    (service,) = workers(closing, address, ["worker"])
    worker = service.worker
    ledger_id = deleted_ledger(bk)
    manager.mark_underreplicated(ledger_id, ["gone:1"])
    # A pass of its loop that starts after the mark was made sees it, and the mark
    # announced again wakes the worker for one.
    passes = worker.stats.passes
    manager.announce_marks()
    assert worker.wait_passes(passes + 1, timeout_s=30)
    assert ledger_id in marks(manager) and manager.claimed() == {}
    manager.enable()
    wait_until(lambda: not marks(manager) and worker.stats.ledgers_deleted == 1,
               "repaired once enabled")
