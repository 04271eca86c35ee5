"""Promoting an embedded WAL to a cluster member (``pybk.open(path, cluster=...)``):
real ZooKeeper, real bookie processes, the WAL's data not copied."""

from __future__ import annotations

import pytest

import pybk
import zkutil
from clusterutil import address, bookies  # noqa: F401 (fixtures)
from pybk.errors import InvalidConfiguration
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
