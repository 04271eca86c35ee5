"""pybk: Apache BookKeeper's replicated log storage, in Python.

Layers, bottom up: :mod:`pybk.storage` (the bookie storage engine), :mod:`pybk.meta`
(metadata stores), :mod:`pybk.client` (the ledger protocol), :mod:`pybk.cluster`
(bookies over ZeroMQ); logs follow (see the README).
"""

from pybk.client import BookKeeper
from pybk.errors import BookKeeperError
from pybk.settings import ClientSettings, ServerSettings

__version__ = "0.1.0"

__all__ = ["BookKeeper", "BookKeeperError", "ClientSettings", "ServerSettings",
           "__version__"]
