"""What tests of pybk, and of applications built on it, need beyond the library.

:mod:`pybk.testing.faults`
    :class:`~pybk.testing.faults.FaultyBookieClient`: a bookie client that fails, drops,
    delays or holds back replies, on the single and the batched add paths.
:mod:`pybk.testing.faulty_metadata`
    :class:`~pybk.testing.faulty_metadata.FaultyMetadataStore`: metadata writes held until
    the test releases them, to decide the order of racing updates.
:mod:`pybk.testing.faultyio`
    :class:`~pybk.testing.faultyio.FaultyFileIO`: a file layer that acts out power loss
    (unsynced writes undone, zeroed or garbled) and crashes at a chosen operation.
:mod:`pybk.testing.ledger_records`
    :func:`~pybk.testing.ledger_records.put_ledgers`: many ledger records written straight
    into a metadata store, in batches (listings and audits of many ledgers).
:func:`wait_until`, :func:`returns_in_time`, :data:`WAIT_S`
    A bounded wait for something another thread or process does; a call shown not to
    wait for what takes far longer than the bound, by its returning at all; the bound
    every wait for an expected outcome uses (a guard against hangs on a loaded machine,
    not an expectation of speed).

A throwaway ZooKeeper is :class:`pybk.testing.zookeeper_server.ZooKeeperServer` and a
local cluster of bookie processes :class:`pybk.testing.local_cluster.LocalCluster`; both serve
``pybk localcluster`` too.

May import: every package of the library and :mod:`pybk` itself, as an application
would; only :mod:`pybk.cli` imports it.
"""

from pybk.testing.waiting import WAIT_S, returns_in_time, wait_until

__all__ = ["WAIT_S", "returns_in_time", "wait_until"]
