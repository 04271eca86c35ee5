"""The join floor (docs/DESIGN.md "Stale writers", "A wiped bookie's reads"): a start
that failed leaves no floor below what the former disks served, and a wiped bookie never
vouches for an entry its former disks may have held, whatever order a writer's entries
reach it in (an adv writer's ids, a plain handle's adding threads).  Real bookie nodes on
a real ZooKeeper (the fixtures of tests/test_stale_writers.py), clients over ZeroMQ, real
files."""

from __future__ import annotations

import shutil
import threading

import pytest
import zkutil
from test_stale_writers import (  # noqa: F401  (cluster: a fixture)
    PASSWORD,
    WAIT_S,
    Cluster,
    cluster,
    payload,
    recovery_keeps,
)

import pybk
from pybk.client import LedgerHandle
from pybk.cluster.node import BookieNode
from pybk.errors import BookKeeperError
from pybk.meta.interface import ANY_VERSION
from pybk.settings import ClientSettings
from pybk.storage import format_bookie

pytestmark = pytest.mark.timeout(120)


def _holds(node: BookieNode, ledger_id: int, entry_id: int) -> bool:
    try:
        node.bookie.read_entry(ledger_id, entry_id)
    except BookKeeperError:
        return False
    return True


def _name(cluster: Cluster, bookie_id: str) -> str:
    return next(n for n, node in cluster.nodes.items() if node.bookie_id == bookie_id)


def test_a_start_that_failed_leaves_no_join_floor_below_what_the_old_disks_served(
        cluster, tmp_path):
    """The replacement disks of bookie b3 are started once too early, while b3 still
    runs on its old disks (a second process at its address: it cannot listen; with a
    bookieId, a start on another host fails on the cluster's cookie of the old
    instance, later still).  That start took F from the generator and recorded it for
    good as the new disks' join floor before failing.  b3 goes on
    serving on its old disks: a ledger L (E3/Qw2/Qa2, id above F) takes entries there.
    Then the old disks are lost; the operator removes the cookie and starts the
    replacement disks, whose join floor is still F, so L counts as created after they
    joined and the wiped bookie answers NoSuchLedger/NoSuchEntry for L: with the other
    bookie of the last entry's write set down, recovery takes that one answer as the
    (Qw - Qa) + 1 absence and closes L below an acknowledged entry (a fourth bookie
    takes the re-writes)."""
    for name in ("b1", "b2", "b3"):
        cluster.start(name)
    old = cluster.nodes["b3"].bookie_id
    # The replacement disks, formatted, started at b3's address while b3 runs.
    early = cluster.settings("b3").replace(
        journalDirectory=str(tmp_path / "b3-new" / "journal"),
        ledgerDirectories=(str(tmp_path / "b3-new" / "ledgers"),))
    format_bookie(early)
    with pytest.raises(BookKeeperError, match="cannot listen"):
        BookieNode(early, metadata=cluster.observer()).close()

    writer_client = cluster.closing.enter_context(pybk.connect(
        cluster.address, ClientSettings(addEntryTimeout=2.0, readTimeout=2.0,
                                        explicitLacInterval=0),
        zk_settings=zkutil.settings()))
    writer = writer_client.create_ledger(3, 2, 2, password=PASSWORD)
    last = 0
    while True:  # up to an entry whose write set holds b3, past the first few
        assert writer.add_entry(payload(last)) == last
        if last >= 10 and old in writer.metadata.write_set(last):
            break
        last += 1
    down = next(b for b in writer.metadata.write_set(last) if b != old)

    # b3's old disks are lost; the operator removes its cookie and starts the
    # replacement disks prepared earlier at its address.
    cluster.stop("b3")
    cluster.observer().remove_cookie(old, ANY_VERSION)
    shutil.rmtree(tmp_path / "b3")
    replacement = BookieNode(early, metadata=cluster.observer())
    cluster.closing.callback(replacement.close)
    assert replacement.bookie_id == old
    down_name = _name(cluster, down)
    cluster.stop(down_name)
    cluster.start("b4")  # where recovery re-writes what the bookie down would hold
    recovery_keeps(cluster, writer.id, down_name, last)


def test_an_adv_writer_adding_lower_ids_after_a_wipe_does_not_vouch_for_higher_ones(
        cluster):
    """create_ledger_adv takes ids in any order: E2/Qw2/Qa2 on two bookies; entries
    0..4, then entry 7 (it reaches both bookies and waits only for entries 5 and 6).
    One bookie of the ensemble, W, loses its disks and is started again at its address
    (a join floor above the ledger).  The writer then adds entries 5 and 6: they reach
    the other bookie and the wiped W, plain adds there, so W's ``added_high`` is 6;
    entries 5, 6 and 7 are acknowledged to the writer, which dies.  The other bookie is
    down (not lost) while a recoverer opens the ledger: W holds 5 and 6 and answers
    NoSuchEntry for entry 7 ("above the highest entry a plain add brought"), which
    (Qw - Qa) + 1 = 1 absence makes absent, and the ledger is closed at 6: entry 7,
    acknowledged, is gone for good although the bookie that was down comes back with
    it.  The writer sent W's former disks entry 7 *before* it sent W entries 5 and 6:
    "a writer sends a bookie its entries in id order" does not hold for an adv
    writer."""
    for name in ("b1", "b2", "b3"):
        cluster.start(name)
    writer_client = cluster.closing.enter_context(pybk.connect(
        cluster.address, ClientSettings(addEntryTimeout=2.0, readTimeout=2.0,
                                        explicitLacInterval=0),
        zk_settings=zkutil.settings()))
    writer = writer_client.create_ledger_adv(2, 2, 2, password=PASSWORD)
    for i in range(5):
        assert writer.add_entry(i, payload(i)) == i
    ensemble = writer.metadata.fragments[-1].ensemble
    seven = writer.add_entry_async(7, payload(7))
    nodes = [cluster.nodes[_name(cluster, b)] for b in ensemble]
    for _ in range(2000):  # entry 7 is on both bookies, held back for 5 and 6 only
        if all(_holds(node, writer.id, 7) for node in nodes):
            break
        threading.Event().wait(0.01)
    else:
        pytest.fail("entry 7 did not reach both bookies")
    down, wiped = ensemble
    wiped_name, down_name = _name(cluster, wiped), _name(cluster, down)
    cluster.wipe(wiped_name)
    assert cluster.start(wiped_name).bookie_id == wiped
    # The writer's connection to W is up again (ZeroMQ reconnects to the address).
    for _ in range(2000):
        if getattr(writer_client.bookie_client(wiped), "is_down", True) is False:
            break
        threading.Event().wait(0.01)
    else:
        pytest.fail("the writer did not reconnect to the wiped bookie")
    assert writer.add_entry(5, payload(5)) == 5
    assert writer.add_entry(6, payload(6)) == 6
    assert seven.result(timeout=WAIT_S) == 7
    assert writer.metadata.fragments[-1].ensemble == ensemble  # no ensemble change
    # The writer dies here; the other bookie is down while a recoverer opens the ledger.
    cluster.stop(down_name)
    recovery_keeps(cluster, writer.id, down_name, 7)


def test_adds_from_several_threads_reach_a_wiped_bookie_below_one_its_disks_took(
        cluster, monkeypatch):
    """A plain handle with several adding threads: each add takes its id under the
    handle's lock and is sent after releasing it, so a bookie may be sent entry 7 before
    entries 4 and 6.  E3/Qw2/Qa2, entries 0..3; three threads take ids 4, 5 and 6 and are
    preempted before sending (forced here); the main thread adds entry 7, which its
    write set takes (held back for 4..6).  W, the bookie of 7's write set that 6's and
    4's hold too, loses its disks and is started again at its address (join floor
    above the ledger); the writer's connection comes back, the threads go on: entries 4
    and 6 reach W as plain adds (``added_high`` 6) and entries 4..7 are acknowledged;
    the writer dies.  The other bookie of 7's write set is down (not lost) while a
    recoverer opens the ledger: entries 3..6 are found, and W answers NoSuchEntry for
    entry 7, the (Qw - Qa) + 1 = 1 absence, so the ledger is closed at 6: entry 7,
    acknowledged, is lost although its other copy comes back.  "A writer sends a
    bookie its entries in id order" does not hold for a plain writer either."""
    for name in ("b1", "b2", "b3", "b4"):
        cluster.start(name)
    writer_client = cluster.closing.enter_context(pybk.connect(
        cluster.address, ClientSettings(addEntryTimeout=2.0, readTimeout=2.0,
                                        explicitLacInterval=0),
        zk_settings=zkutil.settings()))
    writer = writer_client.create_ledger(3, 2, 2, password=PASSWORD)
    for i in range(4):
        assert writer.add_entry(payload(i)) == i
    ensemble = writer.metadata.fragments[-1].ensemble

    reached = {i: threading.Event() for i in (4, 5, 6)}
    go = threading.Event()
    cluster.closing.callback(go.set)  # never left waiting
    real_send = LedgerHandle._send

    def preempted(self, entry_id, entry, bookie_ids, real_send=real_send):
        if self is writer and entry_id in reached:
            reached[entry_id].set()
            go.wait(WAIT_S)
        return real_send(self, entry_id, entry, bookie_ids)
    monkeypatch.setattr(LedgerHandle, "_send", preempted)
    results: dict[int, object] = {}

    def add(i: int) -> None:
        try:
            results[i] = writer.add_entry(payload(i))
        except BaseException as e:  # reported by the assertion below
            results[i] = e
    threads = {}
    for i in (4, 5, 6):
        threads[i] = threading.Thread(target=add, args=(i,), daemon=True)
        threads[i].start()
        assert reached[i].wait(WAIT_S), f"the add of entry {i} never took its id"
    seven = writer.add_entry_async(payload(7))
    nodes = [cluster.nodes[_name(cluster, b)] for b in writer.metadata.write_set(7)]
    for _ in range(2000):  # entry 7 is on its write set, held back for 4..6 only
        if all(_holds(node, writer.id, 7) for node in nodes):
            break
        threading.Event().wait(0.01)
    else:
        pytest.fail("entry 7 did not reach its write set")
    # W: of entry 7's write set, the bookie that 6's holds too; the other one is down.
    wiped, = set(writer.metadata.write_set(7)) & set(writer.metadata.write_set(6))
    down, = set(writer.metadata.write_set(7)) - {wiped}
    wiped_name, down_name = _name(cluster, wiped), _name(cluster, down)
    cluster.wipe(wiped_name)
    assert cluster.start(wiped_name).bookie_id == wiped
    for _ in range(2000):  # the writer's connection to W is up again
        if getattr(writer_client.bookie_client(wiped), "is_down", True) is False:
            break
        threading.Event().wait(0.01)
    else:
        pytest.fail("the writer did not reconnect to the wiped bookie")
    go.set()
    for i in (4, 5, 6):
        threads[i].join(WAIT_S)
    assert results == {4: 4, 5: 5, 6: 6}
    assert seven.result(timeout=WAIT_S) == 7
    assert writer.metadata.fragments[-1].ensemble == ensemble  # no ensemble change
    # The writer dies here; the other bookie is down while a recoverer opens the ledger.
    cluster.stop(down_name)
    recovery_keeps(cluster, writer.id, down_name, 7)
