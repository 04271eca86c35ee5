"""The stale-writer guard (docs/DESIGN.md "Stale writers"), under interleavings and
failures that let a bookie that lost or forgot a ledger acknowledge a stale writer, or
let recovery close a ledger below an acknowledged entry.  Real bookie nodes on a real
ZooKeeper (the fixtures of tests/test_stale_writers.py), clients over ZeroMQ; faults
injected only where an interleaving must be forced."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import zkutil
from conftest import entry
from test_stale_writers import (  # noqa: F401  (cluster: a fixture)
    PASSWORD,
    WAIT_S,
    Cluster,
    _forget,
    cluster,
    hold_metadata_reads,
    payload,
    recovery_keeps,
)

import pybk
from pybk.errors import BookKeeperError, LedgerFenced
from pybk.settings import ClientSettings
from pybk.storage import bookie as bookie_module

pytestmark = pytest.mark.timeout(120)


def _name(cluster: Cluster, bookie_id: str) -> str:
    return next(n for n, node in cluster.nodes.items() if node.bookie_id == bookie_id)


def test_recovery_never_counts_a_wiped_bookie_as_lacking_an_acknowledged_entry(cluster):
    """E3/Qw2/Qa2: entry 10 is acknowledged by both bookies of its write set.  One of them
    is wiped and started again at its address (the operator replacing it, as in
    test_a_bookie_wiped_at_its_address_after_recovery_refuses_the_stale_writer); the
    other is down (not lost: it comes back) while a recoverer opens the ledger.  The
    wiped bookie answers NoSuchLedger/NoSuchEntry, which recovery counts as "lacks the
    entry": (Qw - Qa) + 1 = 1 such answer declares entry 10 absent and the ledger is
    closed at 9.  Entry 10, acknowledged to the writer, is gone for good although its
    only surviving copy comes back.  A bookie that lost its disks does not know that it
    never had the entry; its answer must not count as one (refusing to decide until the
    other bookie answers is fine)."""
    for name in ("b1", "b2", "b3"):
        cluster.start(name)
    # No explicit LAC (a writer that paused right after the add returned).
    writer_client = cluster.closing.enter_context(pybk.connect(
        cluster.address, ClientSettings(addEntryTimeout=2.0, readTimeout=2.0,
                                        explicitLacInterval=0),
        zk_settings=zkutil.settings()))
    writer = writer_client.create_ledger(3, 2, 2, password=PASSWORD)
    for i in range(11):
        assert writer.add_entry(payload(i)) == i  # entry 10: durable on its write set
    wiped, down = writer.metadata.write_set(10)
    wiped_name, down_name = _name(cluster, wiped), _name(cluster, down)
    cluster.wipe(wiped_name)
    assert cluster.start(wiped_name).bookie_id == wiped
    cluster.stop(down_name)
    recovery_keeps(cluster, writer.id, down_name, 10)


def test_a_forget_racing_a_stale_add_never_acknowledges_it(cluster, monkeypatch):
    """Garbage collection forgets a deleted ledger in two steps: the index rows go (and
    the tombstone rises) in one LMDB transaction, then, under the bookie's lock, the
    in-memory tombstone rises and the state goes.  A ledger whose state is not in memory
    (idle states are evicted past IDLE_STATES_KEPT, here 0 to stand for a bookie holding
    many ledgers) is looked up in the index: between the two steps the index no longer
    knows it and the in-memory tombstone is still below it, so for a ledger created after
    the node started (above its floor) a stale plain add is taken unchecked: the ledger
    is made again and the add acknowledged."""
    monkeypatch.setattr(bookie_module, "IDLE_STATES_KEPT", 0)
    for name in ("b1", "b2", "b3"):
        cluster.start(name)
    client = cluster.client()
    writer = client.create_ledger(3, 3, 2, password=PASSWORD)
    for i in range(10):
        writer.add_entry(payload(i))
    recoverer = cluster.client()
    assert recoverer.open_ledger(writer.id, password=PASSWORD).last_add_confirmed == 9

    # Hold each bookie's GC right after the index forgot the ledger (its commit done),
    # whichever thread gets there (housekeeping may, as soon as the deletion is durable).
    resume = threading.Event()
    committed: list[threading.Event] = []
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []
    for node in cluster.nodes.values():
        index = node.bookie._index
        real = index.forget_ledgers
        done = threading.Event()
        committed.append(done)

        def paused(ledger_ids, real=real, done=done):
            real(ledger_ids)
            done.set()
            resume.wait(WAIT_S)
        monkeypatch.setattr(index, "forget_ledgers", paused)

        def collect(bookie=node.bookie):
            try:
                _forget(bookie, writer.id)
            except BaseException as e:  # reported below
                errors.append(e)
        threads.append(threading.Thread(target=collect, name="test-gc", daemon=True))
    recoverer.delete_ledger(writer.id)
    for t in threads:
        t.start()
    try:
        for done in committed:
            assert done.wait(WAIT_S), "GC did not reach forget_ledgers"
        try:
            writer.add_entry(payload(10))
        except LedgerFenced:
            pass
        else:
            pytest.fail("a stale writer was told entry 10 is durable in a deleted ledger")
    finally:
        resume.set()
        for t in threads:
            t.join(WAIT_S)
    assert not errors, errors
    for node in cluster.nodes.values():
        assert not node.bookie.ledger_exists(writer.id), node.bookie_id


def test_a_forgotten_high_ledger_id_costs_no_metadata_read_per_new_ledger(cluster):
    """docs/DESIGN.md, "What it costs": a new ledger never reaches the check, "its id
    comes from the generator after F was taken".  The tombstone is the highest id GC
    ever forgot and is never lowered: once a bookie forgot a ledger whose id is above
    the generator's (a caller-given id, or a promoted WAL's ledger: embedded ids start
    at a random multiple of 2**20 below 2**60, and truncating the promoted log deletes
    them), every ledger the generator hands out afterwards is below it, and each bookie
    reads its metadata (a ZooKeeper sync and read, on the one admission thread) at every
    new ledger's first add, for good."""
    for name in ("b1", "b2", "b3"):
        cluster.start(name)
    client = cluster.client()
    # Below the helper's filler ledger (2**40), far above any id the generator gave.
    high = client.create_ledger_adv(3, 3, 3, password=PASSWORD, ledger_id=2 ** 39)
    high.add_entry(0, payload(0))
    high.close()
    client.delete_ledger(high.id)
    for node in cluster.nodes.values():
        _forget(node.bookie, high.id)
    before = {n: s.ledger_reads for n, s in cluster.stores.items()}
    for _ in range(3):
        ledger = client.create_ledger(3, 3, 3, password=PASSWORD)
        for i in range(10):
            ledger.add_entry(payload(i))
        ledger.close()
    assert {n: s.ledger_reads for n, s in cluster.stores.items()} == before


def test_adds_waiting_for_unknown_ledger_checks_never_stop_a_bookie_serving_reads(
        cluster, monkeypatch):
    """docs/THREADS.md: "ZooKeeper is never awaited on the data path"; the server answers
    plain reads before it reads the next request.  Adds to ledgers a bookie does not know,
    with ids at or below its floor, wait for a metadata read each, one at a time on the
    admission thread, and count as adds in progress meanwhile: once
    maxAddsInProgressLimit of them wait (a client flooding adds to old ledger ids, or a
    handful of stale or newcomer adds while ZooKeeper is slow: each check may take
    zkOperationTimeoutMs), the server stops reading requests, so a read of a ledger the
    bookie holds is not answered until the checks drain.  ZooKeeper not answering is
    simulated by holding the node's metadata reads; limit 8 stands for the default
    10,000."""
    observer = cluster.observer()
    for _ in range(20):  # ids 0..19: ledgers created before the node, unknown to it
        observer.next_ledger_id()
    original = Cluster.settings

    def limited(self, name):
        return dataclasses.replace(original(self, name), maxAddsInProgressLimit=8)
    monkeypatch.setattr(Cluster, "settings", limited)
    node = cluster.start("b1")
    client = cluster.client()
    held = client.create_ledger(1, 1, 1, password=PASSWORD)
    held.add_entry(payload(0))  # a ledger the bookie holds, created after the node

    zookeeper_back = hold_metadata_reads(cluster.stores["b1"], monkeypatch)
    flooder = cluster.client().bookie_client(node.bookie_id)
    adds = [flooder.add(ledger_id, 0, entry(ledger_id, 0), b"any key")
            for ledger_id in range(8)]
    try:
        reader = cluster.client()
        try:
            data = reader.bookie_client(node.bookie_id).read(held.id, 0).result(
                timeout=WAIT_S)
        except BookKeeperError as e:
            pytest.fail(f"a read of a ledger the bookie holds was not answered while adds "
                        f"to unknown ledgers waited for their checks: {e!r}")
        assert data
    finally:
        zookeeper_back.set()
    for add in adds:  # none of these ledgers exists: every add is refused
        with pytest.raises(LedgerFenced):
            add.result(timeout=WAIT_S)
