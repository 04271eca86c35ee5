"""The asyncio face of the embedded WAL: ``wal = await pybk.aio.open(path)``.

:class:`AsyncWAL` calls a :class:`pybk.WAL` opened (and closed) on a thread; appends,
ordering, back-pressure, cancellation and streams are those of :mod:`pybk.aio.log`.
Durability is the WAL's: a position is returned once the record is fdatasync'd.
"""

from __future__ import annotations

import asyncio
import functools
import os
from typing import Any

from pybk.aio.bridge import MAX_PENDING_DEFAULT, Bridge, Feed
from pybk.aio.log import Appends, AsyncLogReader
from pybk.errors import LogClosed
from pybk.log.position import Position
from pybk.log.reader import Record
from pybk.log.wal import WAL


async def open(path: str | os.PathLike[str], *,  # noqa: A001
               max_pending: int = MAX_PENDING_DEFAULT, **options: Any) -> "AsyncWAL":
    """Open (creating it if new) the embedded WAL in ``path`` without holding the loop.

    ``options`` are those of :func:`pybk.open` (settings by name, ``cluster=``...);
    ``max_pending`` bounds the records queued or in flight (more wait for room).  If the
    open fails, or the caller is cancelled, nothing stays open."""
    where = os.path.abspath(os.fspath(path))
    bridge = Bridge(lambda: LogClosed(f"the WAL at {where} is closed: open it again "
                                      "(pybk.aio.open) to go on"), max_pending)
    try:
        wal = await bridge.open(functools.partial(WAL, path, **options), WAL.close)
    except BaseException:
        await asyncio.shield(bridge.close())
        raise
    return AsyncWAL(bridge, wal)


class AsyncWAL:
    """An embedded WAL for asyncio code.  Close it (``await wal.close()``) or use
    ``async with``; it closes the WAL underneath."""

    def __init__(self, bridge: Bridge, wal: WAL) -> None:
        self._bridge = bridge
        #: The thread-based WAL underneath (its blocking calls must not run on the loop).
        self.wal = wal
        self.path = wal.path
        self._appends = Appends(bridge, wal.append_async, wal.sync, wal.truncate,
                                f"the WAL at {wal.path}")
        self.submit = self._appends.submit
        self.append = self._appends.append
        self.sync = self._appends.sync
        self.truncate = self._appends.truncate

    def read(self, start: Position | str | None = None) -> Feed[Record]:
        """``async for position, data in wal.read(start)``: every record from ``start``
        (the first when None) to the last one acknowledged, in order."""
        return self.reader(start).read()

    def reader(self, start: Position | str | None = None) -> AsyncLogReader:
        """A reader from ``start`` that can also tail the WAL (``reader.tail()``)."""
        return AsyncLogReader(self._bridge, self.wal.reader(start))

    async def close(self) -> None:
        """Stop the streams, finish what was queued and close the WAL (its directory is
        free again once this returns).  Closing again does nothing."""
        self._appends.refuse()
        await self._bridge.close(self.wal.close)

    async def __aenter__(self) -> "AsyncWAL":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
