"""pybk's cluster layer: what runs between processes.

:mod:`pybk.cluster.wire` is the ZeroMQ protocol, :class:`BookieServer` serves a
:class:`pybk.storage.Bookie`, and :class:`ZmqBookieClient` is the
:class:`pybk.client.transport.BookieClient` that talks to one (several of them can share
one :class:`ClientLoop`, the I/O thread that owns their sockets).
:mod:`pybk.cluster.zookeeper_server` starts throwaway ZooKeeper servers (one, or an
ensemble on loopback) for tests, local clusters and benchmarks.
"""

from pybk.cluster.client import ClientLoop, ZmqBookieClient
from pybk.cluster.server import BookieServer

__all__ = ["BookieServer", "ClientLoop", "ZmqBookieClient"]
