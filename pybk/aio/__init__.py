"""pybk for asyncio: the WAL, the ledger client and logs with ``await`` and ``async for``.

``wal = await pybk.aio.open(path)``, ``wal = await pybk.aio.open_readonly(path)`` (a WAL
another process owns) and ``bk = await pybk.aio.connect(address)`` (or
``AsyncBookKeeper(bk)`` over a client made otherwise) wrap the thread-based objects of
pybk; there is no second implementation of the protocol.  Their ``records()`` feeds give
:class:`~pybk.log.record.Record` values (``pybk.aio.Record``, the same class).  What runs where, how
completions reach the loop, and back-pressure: :mod:`pybk.aio.bridge`; what a cancelled
append means: :mod:`pybk.aio.log`.  The loop never waits for a disk, a bookie or
ZooKeeper: every blocking call runs on one of pybk's threads.

May import: the base modules, the library's packages up to :mod:`pybk.spark`
(docs/DESIGN.md, "Layers").
"""

from pybk.aio.bridge import MAX_PENDING_DEFAULT, Feed
from pybk.aio.client import AsyncBookKeeper, AsyncLedger, AsyncLedgerAdv, connect
from pybk.aio.log import AsyncLogReader, AsyncLogWriter
from pybk.aio.wal import AsyncReadOnlyWAL, AsyncWAL, open, open_readonly
from pybk.log.record import Record

__all__ = ["MAX_PENDING_DEFAULT", "AsyncBookKeeper", "AsyncLedger", "AsyncLedgerAdv",
           "AsyncLogReader", "AsyncLogWriter", "AsyncReadOnlyWAL", "AsyncWAL", "Feed",
           "Record", "connect", "open", "open_readonly"]
