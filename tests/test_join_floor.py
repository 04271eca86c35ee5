"""The join floor (docs/DESIGN.md "Stale writers", "A wiped bookie's reads"): a start
that failed leaves no floor below what the former disks served, and a healthy bookie
newer than a ledger lets its recovery finish: real bookie nodes on a real ZooKeeper (the fixtures of
tests/test_stale_writers.py), clients over ZeroMQ, real files."""

from __future__ import annotations

import shutil

import pytest
import zkutil
from test_stale_writers import (  # noqa: F401  (cluster: a fixture)
    PASSWORD,
    Cluster,
    cluster,
    payload,
)

import pybk
from pybk.cluster.node import BookieNode
from pybk.errors import BookKeeperError, LedgerRecoveryError
from pybk.meta.interface import ANY_VERSION
from pybk.settings import ClientSettings
from pybk.storage import format_bookie

pytestmark = pytest.mark.timeout(120)


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
    recoverer = cluster.client()
    try:
        recovered = recoverer.open_ledger(writer.id, password=PASSWORD)
    except LedgerRecoveryError:
        recovered = None  # undecided while the only copy is down: acceptable
    cluster.start(down_name)
    if recovered is not None:
        assert recovered.last_add_confirmed >= last, (
            f"recovery closed the ledger at {recovered.last_add_confirmed}, below entry "
            f"{last}, which the writer was told is durable")


def test_a_healthy_newcomer_holding_the_last_fragment_lets_recovery_finish(cluster):
    """E1/Qw1/Qa1 (a log asked for one copy): the writer's bookie b1 becomes unreachable
    to it and the ensemble change brings in b4, a bookie started after the ledger was
    created (its join floor is above the ledger's id); b4 acknowledges entries 10..12,
    then the writer dies.  Every bookie is up and holds all it was given.  Recovery
    reads entry 13 past the end: b4, the whole write set, answers EntryMaybeLost, which
    never counts as absent, so recovery fails, and fails again at every attempt: the
    ledger (a log's last segment: the log) can never be recovered, and nothing lets an
    operator finish it."""
    cluster.start("b1")
    client, faulty = cluster.faulty_client(ClientSettings(
        addEntryTimeout=2.0, readTimeout=2.0, explicitLacInterval=0))
    writer = client.create_ledger(1, 1, 1, password=PASSWORD)
    for i in range(10):
        writer.add_entry(payload(i))
    first = writer.metadata.fragments[-1].ensemble[0]
    newcomer = cluster.start("b4").bookie_id
    faulty(first).faults.unreachable = True
    for i in range(10, 13):
        assert writer.add_entry(payload(i)) == i
    assert writer.metadata.fragments[-1].ensemble == (newcomer,)
    # The writer dies here.
    for _attempt in range(2):
        try:
            recovered = cluster.client().open_ledger(writer.id, password=PASSWORD)
        except LedgerRecoveryError as e:
            failure = e
            continue
        assert recovered.last_add_confirmed == 12
        assert [e.data for e in recovered.read_entries(0, 12)] == \
            [payload(i) for i in range(13)]
        return
    pytest.fail(f"recovery of a ledger whose bookies are all up and hold every entry "
                f"keeps failing: {failure}")
