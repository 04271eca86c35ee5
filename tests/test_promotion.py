"""Promoting an embedded WAL to a cluster member (``pybk.open(path, cluster=...)``):
real ZooKeeper, real bookie processes, the WAL's data not copied."""

from __future__ import annotations

import pytest

import pybk
import zkutil
from clusterutil import address, bookies  # noqa: F401 (fixtures)
from pybk.client.transport import InProcessBookieClient
from pybk.errors import ClientClosed, InvalidConfiguration
from pybk.meta.ledgers import LedgerManager
from pybk.meta.zookeeper import ZooKeeperMetadataStore

pytestmark = pytest.mark.timeout(180)


def test_a_promoted_wal_keeps_its_records_and_replicates_new_ones(tmp_path, address,
                                                                   bookies):
    directory = tmp_path / "wal"
    with pybk.open(directory) as wal:
        before = [(wal.append(b"local %d" % i), b"local %d" % i) for i in range(100)]
    bookies.start_serving(3)
    with pybk.open(directory, cluster=address, ensemble=3, write_quorum=2, ack_quorum=2,
                   listenAddress="127.0.0.1:0", addEntryTimeout=5.0) as wal:
        assert list(wal.read()) == before  # read where they are: nothing was copied
        after = [(wal.append(b"replicated %d" % i), b"replicated %d" % i)
                 for i in range(50)]
        current = wal._writer.metadata.segments[-1]
        assert after[0][0].segment == current.number
        wal_bookie = wal.bookie_id
        with ZooKeeperMetadataStore(address, zkutil.settings()) as store:
            metadata = LedgerManager(store).read(current.ledger_id).metadata
            assert wal_bookie in store.bookies()  # the WAL's bookie serves peers
        assert metadata.ensemble_size == 3 and metadata.write_quorum_size == 2
        assert metadata.fragments[0].ensemble[0] == wal_bookie  # local first
        assert list(wal.read()) == before + after
    with pytest.raises(InvalidConfiguration, match="promoted"):
        pybk.open(directory)
    with pybk.open(directory, cluster=address, ensemble=3, write_quorum=2, ack_quorum=2,
                   listenAddress="127.0.0.1:0") as wal:
        assert list(wal.read()) == before + after  # reopened as a member: all there


def test_a_promoted_wal_writes_to_its_own_bookie_in_process(tmp_path, address, bookies):
    """The WAL's client calls its own bookie directly, not through its ZeroMQ server:
    with the server closed (peers can no longer reach it), appends still land on the
    local bookie and no ensemble change replaces it; old and new records stay readable."""
    directory = tmp_path / "wal"
    with pybk.open(directory) as wal:
        before = [(wal.append(b"local %d" % i), b"local %d" % i) for i in range(20)]
    bookies.start_serving(3)  # four bookies in all: one could replace the WAL's own
    with pybk.open(directory, cluster=address, ensemble=3, write_quorum=2, ack_quorum=2,
                   listenAddress="127.0.0.1:0", addEntryTimeout=5.0) as wal:
        assert isinstance(wal._bk.bookie_client(wal.bookie_id), InProcessBookieClient)
        wal._node.server.close()  # nothing reaches the WAL's bookie over ZeroMQ now
        after = [(wal.append(b"replicated %d" % i), b"replicated %d" % i)
                 for i in range(30)]
        segment = wal._writer.metadata.segments[-1]
        assert {position.segment for position, _ in after} == {segment.number}
        metadata = wal._bk.ledger_manager.read(segment.ledger_id).metadata
        assert len(metadata.fragments) == 1  # no add to the local bookie failed
        assert metadata.fragments[0].ensemble[0] == wal.bookie_id
        last_entry = after[-1][0].entry
        local_entries = [e for e in range(last_entry + 1)
                         if wal.bookie_id in metadata.write_set(e)]
        assert local_entries
        for entry_id in local_entries:  # on the WAL's own disks, written without a socket
            assert wal.bookie.read_entry(segment.ledger_id, entry_id)
        assert list(wal.read()) == before + after


def test_a_closed_cluster_client_refuses_every_call(address):
    bk = pybk.BookKeeper(address)
    bk.close()
    for call in (lambda: bk.create_ledger(1, 1, 1), lambda: bk.open_ledger(0),
                 lambda: bk.delete_ledger(0), bk.list_ledgers):
        with pytest.raises(ClientClosed, match="client is closed"):
            call()
    bk.close()
