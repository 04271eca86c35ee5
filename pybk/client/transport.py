"""How the ledger client reaches bookies: one small interface returning futures.

:class:`BookieClient` is everything the protocol needs from one bookie.  Two kinds plug
in: :class:`InProcessBookieClient` calls a :class:`pybk.storage.Bookie` in this process
directly (no serialization: an application hosting a bookie writes to itself this way),
and the ZeroMQ client of :mod:`pybk.cluster`.  :class:`pybk.testing.faults.FaultyBookieClient`
wraps either to fail, delay or drop operations, so that tests drive quorum, fencing and
recovery deterministically.

Every method returns a :class:`concurrent.futures.Future` and never blocks on I/O; a
future's exception is a :class:`pybk.errors.BookKeeperError`.
"""

from __future__ import annotations

import abc
from concurrent.futures import Future
from typing import Any, Callable, Protocol, Sequence

from pybk.errors import BookieUnavailable, BookKeeperError
from pybk.storage import LAST_ENTRY, Bookie

AddCallback = Callable[[BaseException | None], None]

#: ``sink(tokens, errors)``: the adds given ``tokens`` finished together; ``errors`` is
#: None when every one is durable, else a list with an error (or None) per token.
AddsDone = Callable[[Sequence[Any], Sequence[BaseException | None] | None], None]



class LedgerAdds(Protocol):
    """``send(entry_id, entry, token, more=False) -> queued``: see
    :meth:`BookieClient.ledger_adds`."""

    def __call__(self, entry_id: int, entry: bytes, token: Any, more: bool = False) -> bool:
        ...


class BookieClient(abc.ABC):
    """The operations of one bookie, asynchronous."""

    bookie_id: str

    @abc.abstractmethod
    def add(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
            recovery: bool = False, *, deferred: bool = False) -> Future:
        """Store an entry; the future completes (None) once it is durable on the bookie
        (``deferred``, an add of a DEFERRED_SYNC ledger: once it is written there, durable
        after the next :meth:`force_ledger`)."""

    def add_then(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                 callback: AddCallback, recovery: bool = False, *,
                 deferred: bool = False) -> None:
        """:meth:`add`, calling ``callback(None)`` once the entry is durable or
        ``callback(error)``, instead of returning a future.  The ledger client adds this
        way; a transport that can skip the future per add overrides it."""
        self.add(ledger_id, entry_id, entry, master_key, recovery,
                 deferred=deferred).add_done_callback(
            lambda future: callback(future.exception()))

    def add_grouped(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                    token: Any, sink: AddsDone, recovery: bool = False, *,
                    deferred: bool = False) -> None:
        """:meth:`add_then` for a caller with many adds in flight: ``sink(tokens,
        errors)`` reports this add, by ``token``, together with other adds given the same
        ``sink`` object that finished with it.  A transport that answers adds in batches
        (the ZeroMQ client: one reply per ADD message) calls ``sink`` once per batch, so
        the caller takes its lock once per batch instead of once per add."""
        self.add_then(ledger_id, entry_id, entry, master_key,
                      lambda error: sink((token,), None if error is None else (error,)),
                      recovery, deferred=deferred)

    def ledger_adds(self, ledger_id: int, master_key: bytes, sink: AddsDone,
                    recovery: bool = False, *, deferred: bool = False) -> LedgerAdds | None:
        """A faster :meth:`add_grouped` for many adds of one ledger, or None if this
        transport has none: ``send(entry_id, entry, token)`` queues an add (the ledger,
        key and sink given once), or returns False, queuing nothing, when this client can
        take no more adds that way (its connection is down): the caller then asks for
        the bookie's client again.  ``more=True`` says that the caller sends another add
        at once: a transport that sends adds in messages may keep this one for the same
        message (the caller's last add of a group goes without it, so that the group
        leaves then; until it does, a transport sends kept adds only with others, and
        fails them when it refuses the caller's next add)."""
        return None

    @abc.abstractmethod
    def read(self, ledger_id: int, entry_id: int, fence: bool = False,
             master_key: bytes = b"") -> Future:
        """The entry's bytes; ``entry_id=LAST_ENTRY`` reads the last one the bookie holds.

        With ``fence``, the bookie fences the ledger (durably) before reading.
        """

    def read_batch(self, ledger_id: int, entry_ids: Sequence[int], max_bytes: int) -> Future:
        """Entries ``entry_ids`` of the ledger (not fencing), as one request where the
        transport can (the ZeroMQ client: one READ_BATCH message).

        The future gives a list answering the first N ids in order (1 <= N <= their
        number): each answer is the entry's bytes or the BookKeeperError reading it
        raised.  The answers stop before their entries would pass ``max_bytes`` (the
        first id is always answered); the caller asks again for the ids not answered.
        The future fails (Timeout, BookieUnavailable...) when the request as a whole did.

        By default one :meth:`read` after the other, so that the budget holds."""
        return _ReadsInTurn(self, ledger_id, entry_ids, max_bytes).start()

    @abc.abstractmethod
    def read_lac(self, ledger_id: int) -> Future:
        """The highest LAC the bookie knows for the ledger (piggybacked or explicit)."""

    @abc.abstractmethod
    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> Future:
        """Record an explicit LAC (an idle writer's way to advance readers)."""

    @abc.abstractmethod
    def delete_ledger(self, ledger_id: int) -> Future:
        """Delete the ledger's entries on the bookie (its metadata is already gone)."""

    def force_ledger(self, ledger_id: int, first: int = 0, last: int = -1) -> Future:
        """Complete once every add of the ledger this bookie answered so far is durable
        there (BookKeeper's FORCE_LEDGER, for DEFERRED_SYNC ledgers), with how many of
        the entries ``first..last`` the bookie holds (see
        :meth:`pybk.storage.Bookie.force`).  A transport without it fails the future
        with BookKeeperError."""
        return failed_future(BookKeeperError(f"the client of bookie {self.bookie_id} "
                                             "cannot force a ledger"))


class _ReadsInTurn:
    """:meth:`BookieClient.read_batch` made of single reads, one after the other."""

    def __init__(self, client: BookieClient, ledger_id: int, entry_ids: Sequence[int],
                 max_bytes: int) -> None:
        self._client = client
        self._ledger_id = ledger_id
        self._entry_ids = entry_ids
        self._budget = max_bytes
        self._answers: list[bytes | BaseException] = []
        self._result: Future = Future()

    def start(self) -> Future:
        self._read_next()
        return self._result

    def _read_next(self) -> None:
        """Read on while the reads complete at once (no recursion); continue from the
        callback of one that does not."""
        answers = self._answers
        while len(answers) < len(self._entry_ids):
            read = self._client.read(self._ledger_id, self._entry_ids[len(answers)])
            if not read.done():
                read.add_done_callback(self._on_read)
                return
            if not self._take(read):
                break
        self._result.set_result(answers)

    def _on_read(self, read: Future) -> None:
        if self._take(read):
            self._read_next()
        else:
            self._result.set_result(self._answers)

    def _take(self, read: Future) -> bool:
        """Keep the answer of ``read``; False (not kept) if it is over the budget."""
        error = read.exception()
        if error is not None:
            self._answers.append(error)
            return True
        entry = read.result()
        if self._answers and len(entry) > self._budget:
            return False
        self._budget -= len(entry)
        self._answers.append(entry)
        return True


def _completed(fn: Callable[[], object]) -> Future:
    """A future already completed with ``fn()``'s result or its BookKeeperError."""
    future: Future = Future()
    try:
        future.set_result(fn())
    except BookKeeperError as e:
        future.set_exception(e)
    return future


class InProcessBookieClient(BookieClient):
    """Calls a bookie of this process directly."""

    def __init__(self, bookie_id: str, bookie: Bookie) -> None:
        self.bookie_id = bookie_id
        self._bookie = bookie

    def add(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
            recovery: bool = False, *, deferred: bool = False) -> Future:
        future: Future = Future()

        def done(error: BaseException | None) -> None:
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        self.add_then(ledger_id, entry_id, entry, master_key, done, recovery,
                      deferred=deferred)
        return future

    def ledger_adds(self, ledger_id: int, master_key: bytes, sink: AddsDone,
                    recovery: bool = False, *, deferred: bool = False) -> LedgerAdds | None:
        """A bookie in this process never moves: its sender is :meth:`add_grouped`."""
        def send(entry_id: int, entry: bytes, token: Any, more: bool = False) -> bool:
            self.add_grouped(ledger_id, entry_id, entry, master_key, token, sink, recovery,
                             deferred=deferred)
            return True
        return send

    def add_then(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                 callback: AddCallback, recovery: bool = False, *,
                 deferred: bool = False) -> None:
        try:
            self._bookie.add_entry_async(ledger_id, entry_id, entry, master_key,
                                         recovery=recovery, callback=callback,
                                         deferred=deferred)
        except BookKeeperError as e:
            callback(e)

    def read(self, ledger_id: int, entry_id: int, fence: bool = False,
             master_key: bytes = b"") -> Future:
        if not fence:
            return _completed(lambda: self._bookie.read_entry(ledger_id, entry_id))
        future: Future = Future()

        def after_fence(fenced: Future) -> None:
            error = fenced.exception()
            if error is not None:
                future.set_exception(error)
                return
            if not fenced.result():  # as a bookie server answers (pybk/net/server.py)
                future.set_exception(self._bookie.not_held_error(ledger_id))
                return
            try:
                future.set_result(self._bookie.read_entry(ledger_id, entry_id))
            except BookKeeperError as e:
                future.set_exception(e)

        try:
            self._bookie.fence(ledger_id, master_key).add_done_callback(after_fence)
        except BookKeeperError as e:
            future.set_exception(e)
        return future

    def read_lac(self, ledger_id: int) -> Future:
        return _completed(lambda: self._bookie.read_lac(ledger_id))

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> Future:
        try:
            return self._bookie.set_explicit_lac(ledger_id, lac, master_key)
        except BookKeeperError as e:
            return failed_future(e)

    def delete_ledger(self, ledger_id: int) -> Future:
        return _completed(lambda: self._bookie.delete_ledger(ledger_id))

    def force_ledger(self, ledger_id: int, first: int = 0, last: int = -1) -> Future:
        try:
            return self._bookie.force(ledger_id, first, last)
        except BookKeeperError as e:
            return failed_future(e)


class UnavailableBookieClient(BookieClient):
    """Stands for a bookie that cannot be reached at all (e.g. not registered, so its
    address is unknown): every call fails at once with BookieUnavailable(``reason``)."""

    def __init__(self, bookie_id: str, reason: str) -> None:
        self.bookie_id = bookie_id
        self.reason = reason

    def _fail(self, *_args: object, **_kwargs: object) -> Future:
        return failed_future(BookieUnavailable(self.reason))

    add = read = read_lac = write_lac = delete_ledger = force_ledger = _fail


def failed_future(error: BookKeeperError) -> Future:
    """A future that failed with ``error``."""
    future: Future = Future()
    future.set_exception(error)
    return future


def chain(source: Future, target: Future) -> None:
    """Complete ``target`` with ``source``'s outcome once it has one."""
    def copy(done: Future) -> None:
        error = done.exception()
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(done.result())
    source.add_done_callback(copy)


__all__ = ["BookieClient", "InProcessBookieClient", "UnavailableBookieClient", "LAST_ENTRY"]
