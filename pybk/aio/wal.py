"""The asyncio face of the embedded WAL: ``wal = await pybk.aio.open(path)``, and of the
read-only WAL: ``wal = await pybk.aio.open_readonly(path)``.

:class:`AsyncWAL` calls a :class:`pybk.WAL` opened (and closed) on a thread; appends,
ordering, back-pressure, cancellation and streams are those of :mod:`pybk.aio.log`.
Durability is the WAL's: a position is returned once the record is fdatasync'd.

:class:`AsyncReadOnlyWAL` calls a :class:`pybk.ReadOnlyWAL` the same way: what it sees,
and how fresh, is that class's (:mod:`pybk.log.readonly`); its positions and figures read
the metadata and the disk, so they are awaited too.
"""

from __future__ import annotations

import asyncio
import functools
import os
from typing import Any, Callable

from pybk.aio.bridge import MAX_PENDING_DEFAULT, AsyncClosing, Bridge, C, Feed
from pybk.aio.log import Appends, AsyncLogReader
from pybk.errors import LogClosed
from pybk.log.position import Position
from pybk.log.readonly import ReadOnlyWAL
from pybk.log.record import PositionedValue, Record
from pybk.log.wal import WAL
from pybk.log.walinfo import WALStats


async def open(path: str | os.PathLike[str], *,  # noqa: A001
               max_pending: int = MAX_PENDING_DEFAULT, **options: Any) -> "AsyncWAL":
    """Open (creating it if new) the embedded WAL in ``path`` without holding the loop.

    ``options`` are those of :func:`pybk.open` (settings by name, ``cluster=``...);
    ``max_pending`` bounds the records queued or in flight (more wait for room).  If the
    open fails, or the caller is cancelled, nothing stays open."""
    where = os.path.abspath(os.fspath(path))
    bridge = Bridge(lambda: LogClosed(f"the WAL at {where} is closed: open it again "
                                      "(pybk.aio.open) to go on"), max_pending)
    return AsyncWAL(bridge, await _open_on(bridge, functools.partial(WAL, path, **options)))


async def open_readonly(path: str | os.PathLike[str], **settings: Any
                        ) -> "AsyncReadOnlyWAL":
    """Open the WAL in directory ``path`` for reading only, whether or not its
    application has it open (:func:`pybk.open_readonly`, whose ``settings`` these are),
    without holding the loop.  If the open fails, or the caller is cancelled, nothing
    stays open."""
    where = os.path.abspath(os.fspath(path))
    bridge = Bridge(lambda: LogClosed(f"the read-only WAL at {where} is closed"))
    return AsyncReadOnlyWAL(bridge, await _open_on(
        bridge, functools.partial(ReadOnlyWAL, path, **settings)))


async def _open_on(bridge: Bridge, fn: Callable[[], C]) -> C:
    """``fn()`` on ``bridge``'s threads (:meth:`Bridge.open`); the bridge closed if that
    fails or is cancelled."""
    try:
        return await bridge.open(fn)
    except BaseException:
        await asyncio.shield(bridge.close())
        raise


class AsyncWAL(AsyncClosing):
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

    def read(self, start: Position | str | None = None) -> Feed[PositionedValue]:
        """``async for position, data in wal.read(start)``: every record from ``start``
        (the first when None) to the last one acknowledged, in order."""
        return self.reader(start).read()

    def records(self, start: Position | str | None = None) -> Feed[Record]:
        """What :meth:`read` gives, as :class:`~pybk.log.record.Record` values."""
        return self.reader(start).records()

    def reader(self, start: Position | str | None = None) -> AsyncLogReader:
        """A reader from ``start`` that can also tail the WAL (``reader.tail()``)."""
        return AsyncLogReader(self._bridge, self.wal.reader(start))

    async def position_at(self, timestamp: int) -> Position:
        """The position of the first record whose timestamp is at least ``timestamp``,
        or where the next record will go (:meth:`pybk.log.wal.WAL.position_at`)."""
        return await self._bridge.call(self.wal.position_at, timestamp)

    async def close(self) -> None:
        """Stop the streams, finish what was queued and close the WAL (its directory is
        free again once this returns).  Closing again does nothing."""
        self._appends.refuse()
        await self._bridge.close(self.wal.close)


class AsyncReadOnlyWAL(AsyncClosing):
    """A WAL read from another process, for asyncio code.  Close it (``await
    wal.close()``) or use ``async with``; it closes the :class:`pybk.ReadOnlyWAL`
    underneath."""

    def __init__(self, bridge: Bridge, wal: ReadOnlyWAL) -> None:
        self._bridge = bridge
        #: The thread-based read-only WAL underneath (its calls block: not on the loop).
        self.wal = wal
        self.path = wal.path

    def read(self, start: Position | str | None = None) -> Feed[PositionedValue]:
        """``async for position, data in wal.read(start)``: every record from ``start``
        (the first when None) to the last one visible now, in order."""
        return self.reader(start).read()

    def records(self, start: Position | str | None = None) -> Feed[Record]:
        """What :meth:`read` gives, as :class:`~pybk.log.record.Record` values."""
        return self.reader(start).records()

    def reader(self, start: Position | str | None = None) -> AsyncLogReader:
        """A reader from ``start`` that can also tail the WAL (``reader.tail()``: the
        records the owner makes visible, as they come)."""
        self._bridge.check_open()
        return AsyncLogReader(self._bridge, self.wal.reader(start))

    async def position_at(self, timestamp: int) -> Position:
        """The position of the first record visible whose timestamp is at least
        ``timestamp``, or the end (:meth:`pybk.log.wal.WAL.position_at`)."""
        return await self._bridge.call(self.wal.position_at, timestamp)

    async def first_position(self) -> Position | None:
        """The position of the first record visible, or None if there is none."""
        return await self._bridge.call(lambda: self.wal.first_position)

    async def last_position(self) -> Position | None:
        """The position of the last record visible, or None if there is none."""
        return await self._bridge.call(lambda: self.wal.last_position)

    async def space_used(self) -> int:
        """Bytes the WAL's directory takes on disk."""
        return await self._bridge.call(lambda: self.wal.space_used)

    async def stats(self) -> WALStats:
        """The WAL's figures as this handle sees them (:meth:`pybk.ReadOnlyWAL.stats`)."""
        return await self._bridge.call(self.wal.stats)

    async def close(self) -> None:
        """Stop the streams and close the read-only WAL.  Closing again does nothing."""
        await self._bridge.close(self.wal.close)
