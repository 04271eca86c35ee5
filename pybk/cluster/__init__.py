"""Networking: bookies served over ZeroMQ, and the client transport that reaches them.

:mod:`pybk.cluster.wire` is the protocol, :class:`BookieServer` serves a
:class:`pybk.storage.Bookie`, and :class:`ZmqBookieClient` is the
:class:`pybk.client.transport.BookieClient` that talks to one (several of them can share
one :class:`ClientLoop`, the I/O thread that owns their sockets).
"""

from pybk.cluster.client import ClientLoop, ZmqBookieClient
from pybk.cluster.server import BookieServer

__all__ = ["BookieServer", "ClientLoop", "ZmqBookieClient"]
