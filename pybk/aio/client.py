"""The asyncio face of the ledger API: ``bk = await pybk.aio.connect(address)``.

:class:`AsyncBookKeeper` calls a :class:`pybk.BookKeeper`; its metadata calls (create,
open with recovery, delete, list, close) run on the bridge's threads, never on the loop.
:class:`AsyncLedger` adds entries through ``LedgerHandle.add_entry_then``: the add is
sent from the bridge's submitter thread (where the client's ``throttle`` may make it
wait) and its acknowledgement, in entry-id order, completes an asyncio future on the
loop.  The bridge's room is the client's ``throttle`` (when it has one), so adds from
the loop wait for room instead of meeting TooManyRequests.  Cancellation works as for
log appends (:mod:`pybk.aio.log`): an add once queued is sent and may be acknowledged;
the ledger's LAC, or reading it, tells.

Ledgers and log writers made through a client share its threads: close them before the
client (closing the client does not close them, as with ``BookKeeper.close``).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from typing import Any, AsyncIterator, Sequence

from pybk.aio.bridge import (
    MAX_PENDING_DEFAULT,
    Admission,
    AsyncClosing,
    Bridge,
    Feed,
    Submissions,
)
from pybk.aio.log import AsyncLogReader, AsyncLogWriter
from pybk.client import BookKeeper
from pybk.client.ledger import LedgerEntry, LedgerHandle
from pybk.client.ledger_adv import LedgerHandleAdv
from pybk.errors import ClientClosed, LedgerClosed
from pybk.log.position import Position
from pybk.log.reader import LogReader
from pybk.log.writer import LogWriter
from pybk.meta.layout import LIST_PAGE_NAMES
from pybk.meta.ledger_metadata import LedgerMetadata
from pybk.settings import ClientSettings, LogSettings


async def connect(address: str, settings: ClientSettings | None = None, *,
                  max_pending: int | None = None, **options: Any) -> "AsyncBookKeeper":
    """A client of the cluster at ``address`` (as :func:`pybk.connect`, with its
    ``options``), connected on a thread.  ``max_pending`` bounds the adds queued or in
    flight (default: the settings' ``throttle``, or
    :data:`~pybk.aio.bridge.MAX_PENDING_DEFAULT` without one)."""
    from pybk.net.connect import connect as connect_cluster  # ZeroMQ and kazoo, only when wanted
    bridge = Bridge(_client_closed, _room_for(settings or ClientSettings(), max_pending))
    try:
        bk = await bridge.open(functools.partial(connect_cluster, address, settings,
                                                 **options))
    except BaseException:
        await asyncio.shield(bridge.close())
        raise
    return AsyncBookKeeper(bk, bridge=bridge)


def _client_closed() -> ClientClosed:
    return ClientClosed("this asyncio client is closed, with the ledgers, log writers and "
                        "readers made through it: make a new client")


def _room_for(settings: ClientSettings, max_pending: int | None) -> int:
    if max_pending is not None:
        return max_pending
    return settings.throttle or MAX_PENDING_DEFAULT


class AsyncBookKeeper(AsyncClosing):
    """A ledger client for asyncio code, over ``bk`` (which it owns: closing this closes
    ``bk``).  Make it inside the loop that will use it."""

    def __init__(self, bk: BookKeeper, max_pending: int | None = None,
                 bridge: Bridge | None = None) -> None:
        #: The thread-based client underneath.
        self.bk = bk
        self._bridge = bridge or Bridge(_client_closed, _room_for(bk.settings, max_pending))

    async def create_ledger(self, ensemble: int = 3, write_quorum: int = 2,
                            ack_quorum: int = 2, **options: Any) -> "AsyncLedger":
        """A new ledger, open for writing (``BookKeeper.create_ledger``'s options)."""
        handle = await self._bridge.open(functools.partial(
            self.bk.create_ledger, ensemble, write_quorum, ack_quorum, **options))
        return AsyncLedger(self._bridge, handle)

    async def create_ledger_adv(self, ensemble: int = 3, write_quorum: int = 2,
                                ack_quorum: int = 2, **options: Any) -> "AsyncLedgerAdv":
        """A new ledger whose caller gives each entry's id
        (``BookKeeper.create_ledger_adv``'s options)."""
        handle = await self._bridge.open(functools.partial(
            self.bk.create_ledger_adv, ensemble, write_quorum, ack_quorum, **options))
        return AsyncLedgerAdv(self._bridge, handle)

    async def open_ledger(self, ledger_id: int, password: bytes = b"",
                          recovery: bool = True) -> "AsyncLedger":
        """Open a ledger for reading (``BookKeeper.open_ledger``: with ``recovery`` it
        fences and closes the ledger first)."""
        handle = await self._bridge.open(functools.partial(
            self.bk.open_ledger, ledger_id, password, recovery))
        return AsyncLedger(self._bridge, handle)

    async def delete_ledger(self, ledger_id: int) -> None:
        await self._bridge.call(self.bk.delete_ledger, ledger_id)

    async def list_ledgers(self) -> list[int]:
        """Every ledger id, ascending, in one list (``BookKeeper.list_ledgers``)."""
        return await self._bridge.call(self.bk.list_ledgers)

    async def iter_ledgers(self, page_size: int = LIST_PAGE_NAMES) -> AsyncIterator[int]:
        """The ledger ids as ``BookKeeper.iter_ledgers`` lists them, ``page_size`` at a
        time read on the bridge's threads: ``async for ledger_id in bk.iter_ledgers()``."""
        ids = await self._bridge.call(self.bk.iter_ledgers, page_size)
        while True:
            page = await self._bridge.call(lambda: list(itertools.islice(ids, page_size)))
            for ledger_id in page:
                yield ledger_id
            if len(page) < page_size:
                return

    async def open_log_writer(self, name: str, settings: LogSettings | None = None,
                              password: bytes = b"") -> AsyncLogWriter:
        """Become the writer of log ``name`` (``LogWriter.open``: created if new, any
        other writer fenced)."""
        writer = await self._bridge.open(functools.partial(
            LogWriter.open, self.bk, name, settings, password))
        return AsyncLogWriter(self._bridge, writer)

    def log_reader(self, name: str, start: Position | str | None = None,
                   password: bytes = b"") -> AsyncLogReader:
        """A reader of log ``name`` from ``start`` (the beginning when None)."""
        return AsyncLogReader(self._bridge, LogReader(self.bk, name, start, password))

    async def close(self) -> None:
        """Stop the streams, send what was queued, and close the client.  Closing again
        does nothing."""
        await self._bridge.close(self.bk.close)


class AsyncLedger(AsyncClosing):
    """A ledger for asyncio code, as its writer or a reader (see the module)."""

    def __init__(self, bridge: Bridge, handle: LedgerHandle) -> None:
        self._bridge = bridge
        #: The thread-based handle underneath.
        self.handle = handle
        self.id = handle.id

        self._closing = False
        self._adds: Submissions[int] = Submissions(
            bridge, self._start_adds, lambda: LedgerClosed(f"ledger {self.id} is closed"))
        self._batches: Admission[tuple[int, int]] = Admission(
            bridge, self._start_batches, lambda: LedgerClosed(f"ledger {self.id} is closed"))

    def _start_adds(self, items: list[tuple[Any, asyncio.Future]]) -> None:
        """Send queued adds (on the submitter thread)."""
        for data, future in items:
            try:
                self.handle.add_entry_then(data, functools.partial(self._bridge.post, future))
            except Exception as e:  # refused at once (closed, too large...)
                self._bridge.post(future, None, e)

    def _start_batches(self, items: list[tuple[Any, asyncio.Future]]) -> None:
        """Send queued calls of :meth:`add_entries` (on the submitter thread)."""
        for buffers, future in items:
            count = len(buffers)
            try:
                self.handle.add_entries_then(buffers, functools.partial(
                    _post_range, self._bridge, future, count))
            except Exception as e:  # refused at once (closed, too large...)
                self._bridge.post(future, None, e)

    @property
    def metadata(self) -> LedgerMetadata:
        return self.handle.metadata

    @property
    def last_add_confirmed(self) -> int:
        """The highest entry id known to be acknowledged (-1: none)."""
        return self.handle.last_add_confirmed

    @property
    def length(self) -> int:
        return self.handle.length

    @property
    def is_closed(self) -> bool:
        return self.handle.is_closed

    async def submit(self, data: bytes) -> "asyncio.Future[int]":
        """Queue an entry once there is room; the future gives its id once Qa bookies
        acknowledged it (futures complete in entry-id order)."""
        return await self._adds.submit(data)

    async def add(self, data: bytes) -> int:
        """Add an entry; return its id once acknowledged."""
        return await self._adds.wait(data)

    async def add_entries(self, buffers: Sequence[bytes]) -> tuple[int, int]:
        """Add ``buffers`` as consecutive entries in one call
        (``LedgerHandle.add_entries_then``, sent in order with the adds queued before);
        return ``(first id, last id)`` once all were acknowledged.  The call takes the
        room of one add."""
        if not buffers:
            raise ValueError("add_entries needs at least one entry")
        copies = await self._batches.admit_many(buffers)
        return await self._batches.queue(copies)

    async def force(self) -> int:
        """Make every add acknowledged so far durable and return the durable LAC
        (``LedgerHandle.force``, for a ledger created with ``write_flags=
        {WriteFlag.DEFERRED_SYNC}``)."""
        return await self._bridge.call(self.handle.force)

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        return await self._bridge.call(self.handle.read_entry, entry_id)

    def read_entries(self, first: int, last: int) -> Feed[LedgerEntry]:
        """``async for entry in lh.read_entries(first, last)``: read ahead on a thread
        of its own (``LedgerHandle.read_entries``)."""
        return self._bridge.feed(lambda stop: self.handle.read_entries(first, last))

    async def read_last_add_confirmed(self) -> int:
        """Ask the bookies for the LAC (``LedgerHandle.read_last_add_confirmed``)."""
        return await self._bridge.call(self.handle.read_last_add_confirmed)

    def read_unconfirmed(self, first: int, last: int) -> Feed[LedgerEntry]:
        """``async for entry in lh.read_unconfirmed(first, last)``: entries past the LAC
        too, read ahead on a thread of its own (``LedgerHandle.read_unconfirmed``)."""
        return self._bridge.feed(lambda stop: self.handle.read_unconfirmed(first, last))

    async def try_read_last_add_confirmed(self) -> int:
        """The first bookie's LAC that is higher than this handle's, fast and maybe stale
        (``LedgerHandle.try_read_last_add_confirmed``)."""
        return await self._bridge.call(self.handle.try_read_last_add_confirmed)

    async def close(self) -> None:
        """As the writer: send what was queued, wait for it and close the ledger
        (``LedgerHandle.close``).  As a reader: release it."""
        if self._closing:
            return
        self._closing = True
        self._adds.refuse()
        self._batches.refuse()
        await self._bridge.barrier()
        await self._bridge.call(self.handle.close)  # once its adds' callbacks ran
        self._bridge.deliver()


class AsyncLedgerAdv(AsyncLedger):
    """A ledger whose caller gives each entry's id (``LedgerHandleAdv``): ids may come
    in any order within the ledger's window and are acknowledged in id order, so an
    ``add`` above a missing id waits until another task adds it (or the ledger closes)."""

    handle: LedgerHandleAdv

    def _start_adds(self, items: list[tuple[Any, asyncio.Future]]) -> None:
        for (entry_id, data), future in items:
            try:
                self.handle.add_entry_then(entry_id, data,
                                           functools.partial(self._bridge.post, future))
            except Exception as e:  # a bad id, a closed ledger...: refused at once
                self._bridge.post(future, None, e)

    async def submit(self, entry_id: int, data: bytes  # type: ignore[override]
                     ) -> "asyncio.Future[int]":
        """Queue ``data`` as entry ``entry_id`` once there is room; the future gives the
        id once it and every lower id were acknowledged."""
        return await self._adds.submit(data, entry_id)

    async def add(self, entry_id: int, data: bytes) -> int:  # type: ignore[override]
        """Add ``data`` as entry ``entry_id``; return the id once acknowledged."""
        return await self._adds.wait(data, entry_id)


def _post_range(bridge: Bridge, future: asyncio.Future, count: int, last: int | None,
                error: BaseException | None) -> None:
    """The completion of an :meth:`AsyncLedger.add_entries` call of ``count`` entries:
    ``(first id, last id)`` to its future on the loop, or the error."""
    bridge.post(future, None if last is None else (last - count + 1, last), error)
