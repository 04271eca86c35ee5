"""pybk: Apache BookKeeper's replicated log storage, in Python.

Layers, bottom up: :mod:`pybk.storage` (the bookie storage engine), then metadata, the
ledger client, the cluster and logs (see the README).
"""

from pybk.errors import BookKeeperError
from pybk.settings import ServerSettings

__version__ = "0.1.0"

__all__ = ["BookKeeperError", "ServerSettings", "__version__"]
