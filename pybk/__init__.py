"""pybk: Apache BookKeeper's replicated log storage, in Python.

Layers, bottom up: :mod:`pybk.storage` (the bookie storage engine), :mod:`pybk.meta`
(metadata stores), :mod:`pybk.client` (the ledger protocol), :mod:`pybk.cluster`
(bookies over ZeroMQ, ZooKeeper servers), :mod:`pybk.log` (logs and the embedded WAL).
``pybk.open(path)`` opens an embedded WAL; ``pybk.demote(path)`` turns a promoted one
whose cluster is gone back into an embedded WAL.
"""

from pybk.client import BookKeeper
from pybk.errors import BookKeeperError
from pybk.log import WAL, LogReader, LogWriter, Position
from pybk.log.wal import demote, open
from pybk.settings import ClientSettings, LogSettings, ServerSettings

__version__ = "0.1.0"

__all__ = ["BookKeeper", "BookKeeperError", "ClientSettings", "LogReader", "LogSettings",
           "LogWriter", "Position", "ServerSettings", "WAL", "__version__", "demote",
           "open"]
