"""The asyncio face of a log: :class:`AsyncLogWriter` and :class:`AsyncLogReader`.

They call a :class:`~pybk.log.LogWriter` and a :class:`~pybk.log.LogReader` (an embedded
WAL's own, for :class:`~pybk.aio.AsyncWAL`) through a :class:`~pybk.aio.bridge.Bridge`.

Appends.  ``await writer.append(data)`` returns the record's :class:`Position` once it is
durable, as ``LogWriter.append`` does, and takes the same ``key``, ``timestamp`` and
``headers`` (a timestamp left out is the wall-clock time of the call, not of the moment
the record reaches the writer).  ``await writer.submit(data)`` returns as soon as
the record is queued, with an asyncio future of its position: the way to keep many
records in flight from one task.  Records get positions in the order they were queued
(``submit`` or ``append`` calls, as the loop ran them).  With ``max_pending`` records
queued or in flight, both wait for room (back-pressure) without holding the loop.

Cancellation.  Cancelling a task that awaits ``append`` (or a ``submit``'s future) stops
the wait, not the append: a record once queued is written and may well be durable even
though its caller saw CancelledError (as with a timeout of BookKeeper's client, the
outcome is unknown to the caller; :meth:`AsyncLogWriter.sync` then settles it: after it,
the record is durable or the writer has failed).  A task cancelled while it still waits
for room queued nothing.  Either way the writer goes on undisturbed.

Reading.  ``async for position, data in reader.read()`` (to the end of the log as it is
now) and ``reader.tail()`` (records as they are appended), or ``reader.records()`` and
``reader.tail_records()`` for :class:`~pybk.log.record.Record` values with every field,
run the thread-based reader on a thread of their own, at most
:data:`~pybk.aio.bridge.FEED_BUFFER_RECORDS` records ahead of the consumer; leaving the
loop early with ``break`` stops that thread once the stream is garbage collected, or at
once with ``await stream.aclose()`` (or ``async with``).  A reader reads one stream at a
time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Iterator

from pybk.aio.bridge import CLOSE_TIMEOUT_S, Admission, AsyncClosing, Bridge, Feed
from pybk.errors import LogClosed
from pybk.log.batch import check_fields, check_timestamp, now_ms
from pybk.log.futures import wait_for_callbacks
from pybk.log.position import Position
from pybk.log.reader import LogReader
from pybk.log.record import PositionedValue, Record, position_and_value
from pybk.log.writer import LogWriter

#: Seconds a tailing stream's thread waits for a record before it looks whether it
#: should stop (the longest a stopped tail keeps its thread).
TAIL_POLL_S = 0.1


class Appends(Admission[Position]):
    """Appends of records through ``append_async`` (a WAL's or a log writer's), with
    room, ordering and cancellation as the module says, and the log's sync and
    truncation."""

    def __init__(self, bridge: Bridge, append_async: Callable[..., Future],
                 sync: Callable[[], None], truncate: Callable[[Position | str], object],
                 name: str) -> None:
        def start(items: list[tuple[tuple[bytes, bytes | None, int, Any], asyncio.Future]]
                  ) -> None:
            started = []
            for (data, key, timestamp, headers), future in items:
                try:
                    started.append((append_async(data, key=key, timestamp=timestamp,
                                                 headers=headers), future))
                except Exception as e:  # refused at once (closed, too large...)
                    bridge.post(future, None, e)
            if started:
                bridge.land(started)

        super().__init__(bridge, start, lambda: LogClosed(f"{name} is closed"))
        self._sync = sync
        self._truncate = truncate

    async def submit(self, data: bytes, *, key: bytes | None = None,
                     timestamp: int | None = None,
                     headers: Iterable[tuple[str, bytes]] | None = None
                     ) -> "asyncio.Future[Position]":
        """Queue a record (its fields as ``LogWriter.append`` takes them) once there is
        room; the future gives its position once it is durable.  Its timestamp, if
        not given, is the time of this call; fields past their limits raise here."""
        timestamp = now_ms() if timestamp is None else check_timestamp(timestamp)
        pairs = None
        if key is not None or headers is not None:
            key, pairs, _ = check_fields(key, headers)  # copies of buffers reused later
        return self.queue((await self.admit(data), key, timestamp, pairs))

    async def append(self, data: bytes, *, key: bytes | None = None,
                     timestamp: int | None = None,
                     headers: Iterable[tuple[str, bytes]] | None = None) -> Position:
        """Append a record; return its position once it is durable (see the module
        about cancellation)."""
        return await (await self.submit(data, key=key, timestamp=timestamp,
                                        headers=headers))

    async def sync(self) -> None:
        """Return once every record queued before the call is durable and its future
        done (raises the failure that stopped the writer, if one did)."""
        self.check_open()
        await self._bridge.barrier()
        await self._bridge.call(_then_callbacks, self._sync)
        self._bridge.deliver()

    async def truncate(self, before: Position | str) -> None:
        """Drop the records before ``before`` (see ``LogWriter.truncate``)."""
        self.check_open()
        await self._bridge.call(self._truncate, before)

    async def close(self, close: Callable[[], None]) -> None:
        """Refuse new appends; run ``close`` (which finishes those queued) on a thread.
        Closing again does nothing."""
        if self._refused:
            return
        self.refuse()
        await self._bridge.barrier()
        await self._bridge.call(_then_callbacks, close)
        self._bridge.deliver()


def _then_callbacks(fn: Callable[[], None]) -> None:
    """``fn()``, then wait until the outcomes of the appends it waited for were posted
    (they reach the bridge through pybk's callback thread)."""
    fn()
    wait_for_callbacks(CLOSE_TIMEOUT_S)


class AsyncLogWriter(AsyncClosing):
    """The asyncio face of a :class:`~pybk.log.LogWriter` (see the module).  Made by
    :meth:`pybk.aio.AsyncBookKeeper.open_log_writer`; close it, or use ``async with``."""

    def __init__(self, bridge: Bridge, writer: LogWriter) -> None:
        self.writer = writer
        self.name = writer.name
        self._appends = Appends(bridge, writer.append_async, writer.sync, writer.truncate,
                                f"the writer of log {writer.name}")
        self.submit = self._appends.submit
        self.append = self._appends.append
        self.sync = self._appends.sync
        self.truncate = self._appends.truncate

    async def close(self) -> None:
        """Finish what was queued and close the writer (``LogWriter.close``)."""
        await self._appends.close(self.writer.close)


class AsyncLogReader:
    """The asyncio face of a :class:`~pybk.log.LogReader` (see the module)."""

    def __init__(self, bridge: Bridge, reader: LogReader) -> None:
        self._bridge = bridge
        self.reader = reader

    @property
    def position(self) -> Position:
        """Where the next record will be read from."""
        return self.reader.position

    def read(self) -> Feed[PositionedValue]:
        """``(position, value)`` of every record from the current position to the end
        of the log as it is now."""
        return self._bridge.feed(lambda stop: self.reader.read())

    def records(self) -> Feed[Record]:
        """What :meth:`read` gives, as :class:`~pybk.log.record.Record` values."""
        return self._bridge.feed(lambda stop: self.reader.records())

    def tail(self, idle_timeout: float | None = None) -> Feed[PositionedValue]:
        """``(position, value)`` of records as they are appended: until none came for
        ``idle_timeout`` seconds, or (None) until the stream is closed or its consumer
        stops."""
        return self._bridge.feed(lambda stop: map(
            position_and_value, _tail(self.reader, stop, idle_timeout)))

    def tail_records(self, idle_timeout: float | None = None) -> Feed[Record]:
        """What :meth:`tail` gives, as :class:`~pybk.log.record.Record` values."""
        return self._bridge.feed(lambda stop: _tail(self.reader, stop, idle_timeout))

    async def read_next(self, timeout: float) -> PositionedValue | None:
        """``(position, value)`` of the next record, waiting up to ``timeout`` seconds
        for one (None if none came)."""
        return await self._bridge.call(self.reader.read_next, timeout)

    async def next_record(self, timeout: float) -> Record | None:
        """What :meth:`read_next` gives, as a :class:`~pybk.log.record.Record`."""
        return await self._bridge.call(self.reader.next_record, timeout)


def _tail(reader: LogReader, stop: threading.Event,
          idle_timeout: float | None) -> Iterator[Record]:
    last = time.monotonic()
    while not stop.is_set():
        wait = TAIL_POLL_S if idle_timeout is None else \
            max(0.0, min(TAIL_POLL_S, last + idle_timeout - time.monotonic()))
        record = reader.next_record(wait)
        if record is not None:
            last = time.monotonic()
            yield record
        elif idle_timeout is not None and time.monotonic() - last >= idle_timeout:
            return
