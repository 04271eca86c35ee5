"""Catch-up reads: a range of a ledger's entries, many reads in flight, in order.

Reading one entry after the other costs a round trip each (over ZeroMQ a few thousand
entries/s).  :class:`RangeRead` reads ahead instead: it asks a bookie for many entries
in one request (:meth:`~pybk.client.transport.BookieClient.read_batch`, like
BookKeeper 4.17's batch read), keeps several requests in flight, and hands the entries
to the caller in entry-id order as soon as the next one is there.

Which bookie: an entry is asked of the first bookie of its write set, so the entries of
a ledger striped over its ensemble are read from every bookie of it at once.  A bookie
that failed a read (other than by not having the entry) moves behind the others of
every write set for the rest of the range, so a dead or silent bookie costs one failure
(one ``readTimeout``), not one per request.

Guarantees, those of :meth:`LedgerHandle.read_entry <pybk.client.ledger.LedgerHandle.read_entry>`:

* Every entry's digest is verified, with its ledger id and entry id; a bad copy is a
  failed read of the bookie that sent it.
* An entry whose read failed (an error, a bad copy, no answer within ``readTimeout``) is
  asked of the next bookie of its write set not asked yet.  Once all failed, the caller
  gets every entry before it, then the error ``read_entry`` would raise.
* Entries come in order, each once, and only ``first..last`` is asked for (the caller
  checks that range against the LAC, or the last entry of a closed ledger).

Batching: the entries to ask a bookie for gather in its queue, which is sent (as
requests of at most :data:`READ_BATCH_MAX_ENTRIES` entries) when the bookie has no
request in flight, when it is full, when it holds the entry the caller waits for or an
entry asked again after a failure, or once the whole range is queued.  So a busy bookie
gets full requests, and an idle one what there is (Nagle's idea, as for adds).

Bounds: the read-ahead window starts at :data:`READ_AHEAD_FIRST_ENTRIES` past the next
entry returned (so the first entries come quickly) and grows with the entries returned
up to :data:`READ_AHEAD_MAX_ENTRIES`.  A request brings at most
:data:`READ_BATCH_MAX_BYTES` of entries (a larger entry comes alone).  A request is sent
only while the entries held for the caller plus the budgets of the requests in flight
stay within :data:`READ_AHEAD_MAX_BYTES`, or when none is in flight (so the memory a read
takes is about that bound, plus one entry).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from typing import Callable, Iterator

from pybk.client.digest import DecodedEntry, DigestManager
from pybk.client.transport import BookieClient
from pybk.errors import (
    BookKeeperError,
    DigestMismatch,
    MalformedMessage,
    NoSuchEntry,
    NoSuchLedger,
    Timeout,
)
from pybk.meta.ledger_metadata import LedgerMetadata

log = logging.getLogger(__name__)

#: Entries asked for ahead of the next one the caller gets: at first, and at most.
READ_AHEAD_FIRST_ENTRIES = 16
READ_AHEAD_MAX_ENTRIES = 4096
#: Most bytes held for the caller plus those the requests in flight may bring.
READ_AHEAD_MAX_BYTES = 16 * 1024 * 1024
#: Most entries one request asks for.
READ_BATCH_MAX_ENTRIES = 256
#: Most bytes of entries one request may bring (a larger entry comes alone).
READ_BATCH_MAX_BYTES = 1024 * 1024

#: Errors that say a bookie does not hold an entry: no reason to avoid that bookie.
_ABSENT = (NoSuchEntry, NoSuchLedger)


class _Request:
    __slots__ = ("bookie_id", "entry_ids", "future", "sent", "deadline", "budget")

    def __init__(self, bookie_id: str, entry_ids: list[int], future: Future,
                 sent: float, deadline: float, budget: int) -> None:
        self.bookie_id = bookie_id
        self.entry_ids = entry_ids
        self.future = future
        self.sent = sent  # time.monotonic()
        self.deadline = deadline
        self.budget = budget


class RangeRead:
    """Entries ``first..last`` of a ledger, read ahead (see the module docstring).

    ``client_of(bookie_id)`` gives a bookie's client (it may raise BookKeeperError);
    ``timeout_s`` is how long a request may go unanswered.  Iterate once, on one thread.
    ``observe(sent, taken, ok, entries)``, if given, is called for each request taken in
    (sent at ``sent``, taken in at ``taken``: ``time.monotonic()``), once with the
    entries it brought (``ok``) and once with those that failed, if any (all it asked
    for when the request failed); for the client's READ_ENTRY metric.
    """

    def __init__(self, metadata: LedgerMetadata, digest: DigestManager,
                 client_of: Callable[[str], BookieClient], timeout_s: float,
                 first: int, last: int,
                 observe: Callable[[float, float, bool, int], None] | None = None) -> None:
        self._metadata = metadata
        self._ledger_id = metadata.ledger_id
        self._digest = digest
        self._client_of = client_of
        self._timeout_s = timeout_s
        self._first = first
        self._next = first      # the next entry the caller gets
        self._unasked = first   # the first entry not given to a bookie's queue yet
        self._last = last
        # Per bookie, the entries to ask it for (in the order given; sorted when sent),
        # and the bookies whose queue holds an entry asked again after a failure.
        self._queues: dict[str, list[int]] = {}
        self._urgent: set[str] = set()
        self._in_flight: list[_Request] = []
        self._busy: dict[str, int] = {}  # per bookie, its requests in flight
        self._reserved = 0       # the budgets of the requests in flight
        self._held = 0           # bytes of the entries in self._ready
        # Entry id -> the entry, or the error to raise when the caller gets there.
        self._ready: dict[int, DecodedEntry | BookKeeperError] = {}
        # Entry id -> the bookies that failed to read it, and how (until it is read).
        self._failures: dict[int, list[tuple[str, BaseException]]] = {}
        self._avoided: set[str] = set()  # bookies that failed a read (not by absence)
        self._observe = observe

    def __iter__(self) -> Iterator[DecodedEntry]:
        ready = self._ready
        while self._next <= self._last:
            outcome = ready.pop(self._next, None)
            if outcome is None:
                self._ask()
                self._wait()
                continue
            if isinstance(outcome, BaseException):
                raise outcome
            self._held -= len(outcome.data)
            self._next += 1
            yield outcome

    # -- asking -------------------------------------------------------------------------

    def _ask(self) -> None:
        """Give the entries within the read-ahead window to their bookies' queues, then
        send the queues that are due, the one with the lowest entry first."""
        window = min(READ_AHEAD_MAX_ENTRIES,
                     max(READ_AHEAD_FIRST_ENTRIES, self._next - self._first))
        end = min(self._last, self._next + window - 1)
        while self._unasked <= end:
            entry_id = self._unasked
            self._queue(self._bookies(entry_id)[0], entry_id)
            self._unasked += 1
        queues = self._queues
        for bookie_id in sorted((b for b, queue in queues.items() if queue),
                                key=lambda b: min(queues[b])):
            queue = queues[bookie_id]
            while queue and self._due(bookie_id, queue):
                if self._in_flight and self._held + self._reserved + READ_BATCH_MAX_BYTES \
                        > READ_AHEAD_MAX_BYTES:
                    return  # the bytes in flight are at the bound: wait for answers
                queue.sort()
                entry_ids = queue[:READ_BATCH_MAX_ENTRIES]
                del queue[:READ_BATCH_MAX_ENTRIES]
                self._send(bookie_id, entry_ids)
            self._urgent.discard(bookie_id)

    def _due(self, bookie_id: str, queue: list[int]) -> bool:
        """Whether to send (part of) a bookie's queue now (see the module docstring)."""
        return (not self._busy.get(bookie_id) or len(queue) >= READ_BATCH_MAX_ENTRIES
                or bookie_id in self._urgent or self._unasked > self._last
                or self._next in queue)

    def _queue(self, bookie_id: str, entry_id: int) -> None:
        queue = self._queues.get(bookie_id)
        if queue is None:
            queue = self._queues[bookie_id] = []
        queue.append(entry_id)

    def _bookies(self, entry_id: int) -> tuple[str, ...]:
        """The write set of ``entry_id``, the bookies that failed a read last."""
        write_set = self._metadata.write_set(entry_id)
        if not self._avoided:
            return write_set
        return tuple(sorted(write_set, key=self._avoided.__contains__))

    def _send(self, bookie_id: str, entry_ids: list[int]) -> None:
        try:
            future = self._client_of(bookie_id).read_batch(self._ledger_id, entry_ids,
                                                           READ_BATCH_MAX_BYTES)
        except BookKeeperError as e:
            future = Future()
            future.set_exception(e)
        sent = time.monotonic()
        self._in_flight.append(_Request(bookie_id, entry_ids, future, sent,
                                        sent + self._timeout_s, READ_BATCH_MAX_BYTES))
        self._reserved += READ_BATCH_MAX_BYTES
        self._busy[bookie_id] = self._busy.get(bookie_id, 0) + 1

    # -- answers ------------------------------------------------------------------------

    def _wait(self) -> None:
        """Wait for an answer (or a request's deadline), then take every answer in."""
        in_flight = self._in_flight
        if not in_flight:
            return
        if not any(request.future.done() for request in in_flight):
            timeout = min(request.deadline for request in in_flight) - time.monotonic()
            if timeout > 0:
                wait_futures([request.future for request in in_flight], timeout,
                             FIRST_COMPLETED)
        now = time.monotonic()
        still = []
        for request in in_flight:
            if request.future.done():
                self._answered(request, now)
            elif now >= request.deadline:  # the transport gave no answer in time
                self._reserved -= request.budget
                self._busy[request.bookie_id] -= 1
                self._request_failed(request, Timeout(
                    f"bookie {request.bookie_id} did not answer a read within "
                    f"readTimeout={self._timeout_s}"), now)
            else:
                still.append(request)
        self._in_flight = still

    def _answered(self, request: _Request, now: float) -> None:
        self._reserved -= request.budget
        self._busy[request.bookie_id] -= 1
        error = request.future.exception()
        if error is not None:
            self._request_failed(request, error, now)
            return
        answers = request.future.result()
        entry_ids = request.entry_ids
        if not 1 <= len(answers) <= len(entry_ids):
            self._request_failed(request, MalformedMessage(
                f"bookie {request.bookie_id} answered {len(answers)} reads of "
                f"{len(entry_ids)}"), now)
            return
        bookie_id = request.bookie_id
        failed = 0
        for entry_id, answer in zip(entry_ids, answers):
            if isinstance(answer, BaseException):
                self._failed(entry_id, bookie_id, answer)
                failed += 1
                continue
            try:
                entry = self._digest.decode(entry_id, answer)
            except DigestMismatch as e:
                log.warning("ledger %d entry %d: bad copy on %s (%s)", self._ledger_id,
                            entry_id, bookie_id, e)
                self._failed(entry_id, bookie_id, e)
                failed += 1
                continue
            self._ready[entry_id] = entry
            self._held += len(entry.data)
            if self._failures:
                self._failures.pop(entry_id, None)
        for entry_id in entry_ids[len(answers):]:  # over the budget: ask again
            self._queue(bookie_id, entry_id)
        if len(answers) < len(entry_ids):
            self._urgent.add(bookie_id)
        if self._observe is not None:
            self._observe(request.sent, now, True, len(answers) - failed)
            if failed:
                self._observe(request.sent, now, False, failed)

    def _request_failed(self, request: _Request, error: BaseException, now: float) -> None:
        if self._observe is not None:
            self._observe(request.sent, now, False, len(request.entry_ids))
        for entry_id in request.entry_ids:
            self._failed(entry_id, request.bookie_id, error)

    def _failed(self, entry_id: int, bookie_id: str, error: BaseException) -> None:
        """Ask the next bookie of the write set, or make the error the entry's outcome
        once every bookie of it failed."""
        if not isinstance(error, _ABSENT):
            self._avoided.add(bookie_id)
        failures = self._failures.setdefault(entry_id, [])
        failures.append((bookie_id, error))
        failed = {b for b, _ in failures}
        following = [b for b in self._bookies(entry_id) if b not in failed]
        if following:
            self._queue(following[0], entry_id)
            self._urgent.add(following[0])
        else:
            self._ready[entry_id] = read_error(self._ledger_id, entry_id,
                                               [e for _, e in failures])
            del self._failures[entry_id]


def read_error(ledger_id: int, entry_id: int, errors: list[BaseException]) -> BookKeeperError:
    """The error a reader gets once every bookie of the write set failed."""
    if any(isinstance(e, DigestMismatch) for e in errors):
        return DigestMismatch(f"ledger {ledger_id} entry {entry_id}: no copy with a valid "
                              f"digest ({len(errors)} bookies tried)")
    if errors and all(isinstance(e, _ABSENT) for e in errors):
        return NoSuchEntry(f"ledger {ledger_id} has no entry {entry_id} on any bookie")
    return BookKeeperError(f"ledger {ledger_id} entry {entry_id}: every bookie failed: "
                           + "; ".join(str(e) for e in errors))
