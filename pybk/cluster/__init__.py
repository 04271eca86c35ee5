"""pybk's cluster layer: what runs between processes.

:mod:`pybk.cluster.wire` is the ZeroMQ protocol, :class:`BookieServer` serves a
:class:`pybk.storage.Bookie`, and :class:`ZmqBookieClient` is the
:class:`pybk.client.transport.BookieClient` that talks to one (several of them can share
one :class:`ClientLoop`, the I/O thread that owns their sockets).
:mod:`pybk.cluster.zookeeper_server` starts throwaway ZooKeeper servers (one, or an
ensemble on loopback) for tests, local clusters and benchmarks.

A cluster: :class:`pybk.cluster.node.BookieNode` serves a bookie and keeps it registered
(with its endpoint) in ZooKeeper; :func:`pybk.cluster.connect.connect` (also
``pybk.connect``) makes a client that finds bookies through the registry
(:mod:`pybk.cluster.directory`); :mod:`pybk.cluster.local` runs a throwaway cluster of
bookie processes, :mod:`pybk.cluster.simpletest` checks one, and
:mod:`pybk.cluster.commands` is what the ``pybk`` cluster commands do.

Autorecovery: :mod:`pybk.cluster.autorecovery` runs in every bookie process (and in
``pybk autorecovery``): the auditor election (:mod:`pybk.cluster.election`) and, while
elected, the auditor (:mod:`pybk.cluster.auditor`, with :mod:`pybk.cluster.replicas`
and :mod:`pybk.cluster.ledger_check`), which marks the ledgers of lost bookies in the
under-replication metadata (:mod:`pybk.meta.underreplication`); and a replication worker
(:mod:`pybk.cluster.replication_worker`) that claims marked ledgers and repairs them
(:mod:`pybk.cluster.rereplication`, at a rate kept by :mod:`pybk.cluster.throttle`).
"""

from pybk.cluster.client import ClientLoop, ZmqBookieClient
from pybk.cluster.server import BookieServer

__all__ = ["BookieServer", "ClientLoop", "ZmqBookieClient"]
