"""The network: how bookies and clients talk over ZeroMQ.

:mod:`~pybk.net.wire` is the protocol (version 3) and :mod:`~pybk.net.frames` its
zero-copy framing; :class:`BookieServer` (:mod:`~pybk.net.server`) serves a
:class:`pybk.storage.Bookie`; :class:`ZmqBookieClient` (:mod:`~pybk.net.client`) is the
:class:`pybk.client.transport.BookieClient` that reaches one, several of them sharing one
:class:`ClientLoop`; :mod:`~pybk.net.curve` holds CURVE keys and the server's
authenticator; :mod:`~pybk.net.directory` finds bookies through the registry and
:mod:`~pybk.net.connect` makes a ledger client of a cluster (``pybk.connect``).

May import: the base modules, :mod:`pybk.storage`, :mod:`pybk.meta`, :mod:`pybk.client`.
"""

from pybk.net.client import ClientLoop, ZmqBookieClient
from pybk.net.server import BookieServer

__all__ = ["BookieServer", "ClientLoop", "ZmqBookieClient"]
