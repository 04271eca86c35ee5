"""The ledger client: BookKeeper's replication protocol over any transport.

Start with :class:`BookKeeper`.

May import: the base modules, :mod:`pybk.storage`, :mod:`pybk.meta`.
"""

from pybk.client.bookkeeper import BookKeeper
from pybk.client.deferred import WriteFlag
from pybk.client.ledger import LedgerEntry, LedgerHandle
from pybk.client.ledger_adv import LedgerHandleAdv

__all__ = ["BookKeeper", "LedgerEntry", "LedgerHandle", "LedgerHandleAdv", "WriteFlag"]
