"""A ledger handle: the writer's quorum protocol and the reader's failover.

Writing (docs/DESIGN.md, "Writing"): entry *e* goes to its write set (the Qw bookies of the
ensemble from index ``e % E``); it succeeds once Qa of them acknowledged it durably, and
is confirmed to the caller only after every lower entry was, so the LAC (carried on every
entry) only moves forward.  Completions reach the application in entry-id order, one at
a time (:mod:`pybk.client.completions`).

Acknowledgements are kept per bookie, not per add: each bookie of the last ensemble has a
*watermark*, the highest entry up to which it acknowledged every add of its write sets
above the LAC (answers past one it has not given yet, which come when replies or
caller-given ids arrive out of order, wait in a small set until it comes).  Entry ``e``
has Qa acknowledgements exactly when the Qa-th highest watermark of its write set
reaches ``e``, so the LAC is derived once per reply (with Qw = E: the Qa-th highest
watermark; with striping, per write set ``e % E``).  The pending adds live in slots
(lists of entries, callbacks, lengths and push times, slot i being entry LAC + 1 + i), and
a reply costs one lock and one small step per entry.  A bookie is timed out when its
oldest unanswered pending add (the first of its write sets past its watermark) was sent
more than ``addEntryTimeout`` ago.

Ensemble changes: a bookie of the current ensemble that fails an add (an error, or no
answer within ``addEntryTimeout`` of the add being sent to it) is replaced.  The new
fragment starts at LAC + 1 (or replaces the last fragment in place if that is where it
starts), the metadata is compare-and-set, and the pending adds are sent to the
replacements.  Adds made meanwhile go out at once to the bookies not being replaced; no
add completes while a change is in flight.  Errors from a bookie that is no longer in
the current ensemble change nothing.  Replaced bookies are quarantined by the client
(:meth:`~pybk.client.context.ClientContext.quarantine`), so that the next placements
avoid them for a while.

Closing has one owner, the handle's state: ``OPEN`` until the close is *decided*, under
the lock, either by :meth:`LedgerHandle.close` or by an unrecoverable error (no
replacement bookie, a fenced bookie, a lost metadata race).  The decision fixes the last
entry at the LAC and fails every add still pending, so no add can complete beyond it;
from then on no ensemble change starts or lands, and bookie errors are ignored.  Only
then is the metadata compare-and-set to CLOSED (re-read and decided again on a lost
race: still OPEN, close over it; CLOSED at the same entry, done; otherwise an error).

Recovery (:mod:`pybk.client.recovery`) re-writes the entries it found through a handle
in *recovery mode*: the same pending adds, timeouts and ensemble changes, with the
recovery flag on every add, never choosing a bookie it replaced before, and new
fragments kept in memory until recovery writes them together with the CLOSED state.

Deferred sync (:mod:`pybk.client.deferred`): a ledger created with
``WriteFlag.DEFERRED_SYNC`` sends its adds with that flag (acknowledged once written, not
yet durable), piggybacks the durable LAC that :meth:`LedgerHandle.force` advances (a
force counts a bookie only for the entries it acknowledged, as each bookie's watermark of
acknowledgements records, and still holds), never changes its ensemble, and forces
before it closes.

Reading: an entry is asked of the bookies of its write set in turn, moving on after an
error, a digest mismatch or ``readTimeout``; every entry's digest is verified.  A range
(``read_entries``, and ``read_unconfirmed`` past the LAC) is read ahead with the same
guarantees (:mod:`pybk.client.reads`).

A writer that gives the entry ids itself is :mod:`pybk.client.ledger_adv`'s subclass:
its adds fill the slots in any order (an id not added yet is a hole, which no bookie
acknowledges, so the LAC stops before it), through the hook ``_next_entry_id``.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import itertools
import logging
import threading
import time
from concurrent.futures import Future, as_completed
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from typing import Callable, Iterable, Iterator, Sequence

from pybk.client.completions import AddDone, CompletionQueue
from pybk.client.context import ClientContext, timing
from pybk.client.deferred import AckWatermarks, ForceOp, WriteFlag, entries_stored
from pybk.client.digest import DecodedEntry, DigestManager
from pybk.client.reads import RangeRead, read_error
from pybk.client.transport import AddsDone, LedgerAdds, failed_future
from pybk.errors import (
    BadVersion,
    BookKeeperError,
    ClientClosed,
    DigestMismatch,
    EntryTooLarge,
    LedgerClosed,
    LedgerFenced,
    LedgerRecoveryError,
    NoSuchEntry,
    NoSuchLedger,
    ReadOnlyLedger,
    Timeout,
    Unauthorized,
)
from pybk.meta.ledger_metadata import Fragment, LedgerMetadata, LedgerState
from pybk.meta.ledgers import Versioned

log = logging.getLogger(__name__)

LedgerEntry = DecodedEntry  # what readers get: entry_id, last_add_confirmed, length, data


class _WriteState(enum.Enum):
    OPEN = "open"        # adds are taken
    CLOSED = "closed"    # the close was decided: last entry fixed, pending adds failed
    STOPPED = "stopped"  # recovery mode only: the re-writes are over (done or failed)


class _AckLayout:
    """Where the bookies of a ledger's last ensemble store its entries, as the
    acknowledgement watermarks need it: ``write_sets[r]``, the write set of the entries
    ``e`` with ``e % E == r``; ``gaps[bookie][r]``, from such an entry to the next one
    the bookie stores (1 for every bookie when Qw = E); ``full``, whether Qw = E."""

    __slots__ = ("ensemble", "write_sets", "gaps", "full")

    def __init__(self, metadata: LedgerMetadata) -> None:
        self.ensemble = metadata.fragments[-1].ensemble
        size = len(self.ensemble)
        first = metadata.fragments[-1].first_entry_id
        by_residue: list[tuple[str, ...]] = [()] * size
        for entry_id in range(first, first + size):
            by_residue[entry_id % size] = metadata.write_set(entry_id)
        self.write_sets = tuple(by_residue)
        self.full = metadata.write_quorum_size == size
        self.gaps = {bookie_id: tuple(
            next(gap for gap in range(1, size + 1)
                 if bookie_id in by_residue[(residue + gap) % size])
            for residue in range(size)) for bookie_id in self.ensemble}


def _range_done(handle: "LedgerHandle", first: int, count: int, done: AddDone,
                entry_id: int | None, error: BaseException | None) -> None:
    """The completion of :meth:`LedgerHandle.add_entries_then`'s ``count`` adds from
    ``first``: ``done`` as it is, or with a copy of the error that tells which of them
    were acknowledged (``error.acknowledged``)."""
    if error is not None and isinstance(error, BookKeeperError):
        # Called after the close was decided, at the durable LAC (the LAC but for a
        # DEFERRED_SYNC ledger, whose entries acknowledged past it the close leaves out).
        through = min(handle.last_add_forced, first + count - 1)
        error = copy.copy(error)  # one error fails many calls: each gets its own
        error.__notes__ = list(getattr(error, "__notes__", ()))  # not the shared list
        error.acknowledged = range(first, through + 1)
        error.add_note(f"entries {first}..{first + count - 1} of one add_entries call: "
                       + (f"{first}..{through} acknowledged" if through >= first
                          else "none acknowledged"))
    done(entry_id, error)


def _settle(future: Future, result: Callable[[int], object] | None = None) -> AddDone:
    """An :data:`AddDone` that completes ``future`` (unless it was cancelled) with the
    entry id, or what ``result`` makes of it."""
    def done(entry_id: int | None, error: BaseException | None) -> None:
        if future.set_running_or_notify_cancel():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(entry_id if result is None or entry_id is None
                                  else result(entry_id))
    return done


class LedgerHandle:
    """One open ledger, as its writer (``writable``) or as a reader.

    ``recovery=True`` makes the handle recovery's writer (see the module docstring):
    ``last_add_confirmed`` and ``length`` are where its re-writes continue from.
    ``write_flags`` (a writer's): :class:`WriteFlag` values."""

    #: Whether adds take the ids in order (the handle chooses them); False for a
    #: handle that takes the caller's ids (:mod:`pybk.client.ledger_adv`).
    _ids_in_order = True

    def __init__(self, bk: ClientContext, versioned: Versioned, password: bytes,
                 writable: bool, last_add_confirmed: int = -1, recovery: bool = False,
                 length: int = 0, write_flags: Iterable[WriteFlag] = ()) -> None:
        self._bk = bk
        self._metadata, self._version = versioned
        self.id = self._metadata.ledger_id
        self._digest = DigestManager(self.id, self._metadata.digest_type, password,
                                     self._metadata.mac_key_prefix)
        self._max_payload = bk.settings.maxEntrySizeBytes - self._digest.overhead
        self._master_key = bk.master_key(password)
        self._writable = writable
        self._recovery = recovery
        self._lock = threading.RLock()
        self._drained = threading.Condition(self._lock)  # pending adds all finished
        self._completions = CompletionQueue(self._lock)
        # The pending adds, in slots: slot i is entry ``_base + i`` (``_base`` is LAC + 1
        # while the handle is OPEN), its encoded entry (None: a hole, an id a caller of
        # ledger_adv has not added yet), the callback, the ledger's length with it, and
        # when it was pushed (sent to the bookies of its write set then).
        self._base = last_add_confirmed + 1
        self._entries: list[bytes | None] = []
        self._dones: list[AddDone | None] = []
        self._lengths: list[int] = []
        self._pushed_at: list[float] = []
        self._outstanding = 0  # slots that are not holes
        # Acknowledgements as watermarks (module docstring), per bookie of the last
        # ensemble: the highest entry up to which it acknowledged every add of its write
        # sets above the LAC; the acknowledgements it gave past one missing (ids in any
        # order, replies in any order); and when it joined the ensemble (0: from the
        # start), which its timeouts count from for the adds pushed before.
        self._layout = _AckLayout(self._metadata) if writable else None
        self._through: dict[str, int] = dict.fromkeys(
            self._metadata.fragments[-1].ensemble, last_add_confirmed) if writable else {}
        self._ahead: dict[str, set[int]] = {}
        self._since: dict[str, float] = {}
        self._lac = last_add_confirmed
        self._last_pushed = last_add_confirmed
        self._length = length
        self._confirmed_length = length
        self._deferred = WriteFlag.DEFERRED_SYNC in set(write_flags) and not recovery
        # The durable LAC and its length: the LAC itself unless deferred (then force's).
        self._forced = last_add_confirmed
        self._forced_length = length
        # Deferred: what each bookie acknowledged, which a force answer counts up to.
        self._acks = AckWatermarks(
            last_add_confirmed, lambda bookie_id, entry_id: bookie_id in
            self._metadata.write_set(entry_id), self._metadata.ensemble_size) \
            if self._deferred else None
        # Deferred: the first entry id of each add call still sending its adds (pushed
        # under the lock, sent outside it, one bookie after the other), and the forces
        # waiting for the calls of ids up to their target: (target, send the force).
        self._sending: set[int] = set()
        self._forces_waiting: list[tuple[int, Callable[[], None]]] = []
        self._state = _WriteState.OPEN
        self._closed_by: BookKeeperError | None = None  # why the close was decided
        self._metadata_closed: Future | None = None     # the CLOSED write's outcome
        self._changing_ensemble = False
        self._failed_bookies: set[str] = set()
        # Recovery mode: every bookie replaced so far, never chosen again (see
        # _replace_bookies).
        self._replaced: set[str] = set()
        self._reader_closed = False
        self._lac_sent = last_add_confirmed
        self._ack_sinks: dict[str, AddsDone] = {}  # per bookie: see BookieClient.add_grouped
        # Per bookie, its client's sender (BookieClient.ledger_adds): the add path's one
        # call per bookie.  Dropped when it refuses, and for bookies replaced.
        self._senders: dict[str, LedgerAdds] = {}
        self._last_activity = time.monotonic()
        # Whether this handle's adds count against the client's throttle (recovery's
        # re-writes do not: they finish what is already there; 0: the client has none).
        self._throttled = writable and not recovery and bool(bk.settings.throttle)
        if writable:
            bk._register_writer(self)

    # -- properties ---------------------------------------------------------------

    @property
    def metadata(self) -> LedgerMetadata:
        return self._metadata

    @property
    def last_add_confirmed(self) -> int:
        """The highest entry id known to be acknowledged (-1: none); of a DEFERRED_SYNC
        writer, the durable LAC (:attr:`last_add_forced`), as in BookKeeper."""
        return self._forced if self._deferred else self._lac

    @property
    def last_add_forced(self) -> int:
        """The highest entry id known durable on Qa bookies (BookKeeper's
        ``lastAddForced``): the LAC, except for a DEFERRED_SYNC writer, whose
        :meth:`force` advances it."""
        return self._forced if self._deferred else self._lac

    @property
    def last_add_acknowledged(self) -> int:
        """The highest entry id acknowledged to this writer (for a DEFERRED_SYNC ledger:
        written on Qa bookies, durable only up to :attr:`last_add_forced`)."""
        return self._lac

    @property
    def length(self) -> int:
        """Bytes of payload confirmed so far (for a closed ledger: all of them)."""
        return self._confirmed_length

    @property
    def pending_adds(self) -> int:
        """Adds sent and not yet acknowledged or failed."""
        return self._outstanding

    @property
    def is_closed(self) -> bool:
        return self._reader_closed or self._state is not _WriteState.OPEN \
            or self._metadata.state is LedgerState.CLOSED

    def __enter__(self) -> "LedgerHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ------------------------------------------------------------------

    def add_entry(self, data: bytes) -> int:
        """Add an entry and return its id once Qa bookies acknowledged it."""
        return self.add_entry_async(data).result()

    def add_entry_async(self, data: bytes) -> Future:
        """Add an entry; the future gives its id once acknowledged (in entry-id order)."""
        future: Future = Future()
        self.add_entry_then(data, _settle(future))
        return future

    def add_entry_then(self, data: bytes, done: AddDone) -> None:
        """Add an entry; call ``done(entry_id, None)`` once it is acknowledged, or
        ``done(None, error)``.  Calls come in entry-id order, one at a time, on
        whichever thread completed the add (keep ``done`` short and non-blocking)."""
        self._add(None, data, done)

    def add_entries(self, buffers: Sequence[bytes]) -> tuple[int, int]:
        """Add ``buffers`` as consecutive entries; return ``(first id, last id)`` once
        every one of them was acknowledged (see :meth:`add_entries_then`)."""
        return self.add_entries_async(buffers).result()

    def add_entries_async(self, buffers: Sequence[bytes]) -> Future:
        """Add ``buffers`` as consecutive entries; the future gives ``(first id, last
        id)`` once all were acknowledged, or fails as :meth:`add_entries_then` says
        (futures of a handle complete in entry-id order, with :meth:`add_entry_async`'s)."""
        future: Future = Future()
        count = len(buffers)
        self.add_entries_then(buffers, _settle(future, lambda last: (last - count + 1, last)))
        return future

    def add_entries_then(self, buffers: Sequence[bytes], done: AddDone) -> int:
        """Add ``buffers`` as consecutive entries, in one call: one lock, one throttle
        take and one completion for all of them; return the first one's id.

        ``done(last id, None)`` is called once every entry was acknowledged (in entry-id
        order with the handle's other completions), or ``done(None, error)`` once one
        failed: then the entries before it may have been acknowledged, and
        ``error.acknowledged`` is the range of this call's ids that were and that the
        ledger keeps (a failed add closes the ledger, at the LAC; a DEFERRED_SYNC one
        at the durable LAC, :attr:`last_add_forced`, leaving out the entries
        acknowledged past it).  A buffer that is not bytes, or
        too large, refuses the whole call before any entry is sent (TypeError,
        EntryTooLarge); so does an empty ``buffers`` (ValueError), and, with a
        ``throttle``, more entries than it lets be outstanding (ValueError)."""
        if not self._ids_in_order:
            raise TypeError(f"ledger {self.id} takes the caller's entry ids: add them one "
                            "by one with add_entry(entry_id, data)")
        count = len(buffers)
        if not count:
            raise ValueError("add_entries needs at least one entry")
        for data in buffers:
            self._check_data(data)
        throttle = self._bk.settings.throttle
        if self._throttled and count > throttle:
            raise ValueError(f"{count} entries in one call is more than throttle="
                             f"{throttle} adds outstanding: split the call")
        if self._bk.metrics is not None:
            done = self._bk.metrics.timed_add(done, count)
        if self._throttled:
            self._bk._take_add_permits(count)
        try:
            with self._lock:
                if self._state is not _WriteState.OPEN or not self._writable \
                        or self._recovery or self._bk.closed:
                    self._check_can_add()
                first = self._last_pushed + 1
                lac = self._forced if self._deferred else self._lac
                length = self._length
                lengths = [length := length + len(data) for data in buffers]
                encode = self._digest.encode
                entries = [encode(entry_id, lac, entry_length, data) for entry_id,
                           entry_length, data in zip(range(first, first + count), lengths,
                                                     buffers)]
                self._length = length
                targets = self._push_run(first, entries, lengths,
                                         partial(_range_done, self, first, count, done))
                if self._deferred:
                    self._sending.add(first)
        except BaseException:
            if self._throttled:
                self._bk._release_add_permits(count)
            raise
        size = len(targets)
        try:
            for entry_id, entry in enumerate(entries, first):
                self._send(entry_id, entry, targets[entry_id % size])
        finally:
            if self._deferred:
                self._sent(first)
        return first

    def _check_data(self, data: bytes) -> None:
        """Refuse an entry no bookie would take, before anything is sent."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"entry data must be bytes, not {type(data).__name__}")
        if len(data) > self._max_payload:  # refused here: no bookie would take it
            raise EntryTooLarge(f"entry of {len(data)} bytes is over the {self._max_payload} "
                                f"bytes an entry can carry (maxEntrySizeBytes="
                                f"{self._bk.settings.maxEntrySizeBytes}, less the "
                                f"{self._digest.overhead}-byte entry header)")

    def _add(self, requested: int | None, data: bytes, done: AddDone) -> None:
        """Add an entry as :meth:`add_entry_then` says, under the id
        :meth:`_next_entry_id` gives for ``requested``."""
        self._check_data(data)
        if self._bk.metrics is not None:
            done = self._bk.metrics.timed_add(done)
        if self._throttled:
            self._bk._take_add_permits()
        try:
            with self._lock:
                if self._state is not _WriteState.OPEN or not self._writable \
                        or self._recovery or self._bk.closed:
                    self._check_can_add()
                entry_id = self._next_entry_id(requested)
                self._length += len(data)
                entry = self._digest.encode(
                    entry_id, self._forced if self._deferred else self._lac, self._length,
                    data)
                targets = self._push(entry_id, entry, done)
                if self._deferred:
                    self._sending.add(entry_id)
        except BaseException:
            if self._throttled:
                self._bk._release_add_permits()
            raise
        if not self._deferred:
            self._send(entry_id, entry, targets)
            return
        try:
            self._send(entry_id, entry, targets)
        finally:
            self._sent(entry_id)

    def _sent(self, first: int) -> None:
        """Deferred: the add call of ``first`` sent its adds to every bookie of their
        write sets: send the forces that waited for it (see :meth:`force_async`)."""
        with self._lock:
            self._sending.discard(first)
            if not self._forces_waiting:
                return
            lowest = min(self._sending, default=None)
            ready = [send for target, send in self._forces_waiting
                     if lowest is None or target < lowest]
            self._forces_waiting = [(target, send) for target, send in self._forces_waiting
                                    if lowest is not None and target >= lowest]
        for send in ready:
            send()

    def _next_entry_id(self, requested: int | None) -> int:
        """The id of the add being made: the next one (a handle with caller-given ids
        checks ``requested`` instead).  Caller holds the lock."""
        return self._last_pushed + 1

    def _recovery_add(self, entry: DecodedEntry) -> Future:
        """Recovery mode: re-write ``entry`` (the next one) as it was written, with the
        recovery flag; the future gives its id once Qa bookies acknowledged it."""
        future: Future = Future()
        with self._lock:
            if self._state is not _WriteState.OPEN:
                raise LedgerRecoveryError(f"ledger {self.id}: re-writing entries failed: "
                                          f"{self._closed_by or 'recovery stopped'}")
            entry_id = self._last_pushed + 1
            assert entry.entry_id == entry_id, (entry.entry_id, entry_id)
            self._length = entry.length
            encoded = self._digest.encode(entry_id, entry.last_add_confirmed, entry.length,
                                          entry.data)
            targets = self._push(entry_id, encoded, _settle(future))
        self._send(entry_id, encoded, targets)
        return future

    def _push(self, entry_id: int, entry: bytes, done: AddDone) -> Sequence[str]:
        """Put a new pending add into its slot; return the bookies to send it to now (its
        write set less the bookies an ensemble change is replacing).  Caller holds the
        lock."""
        self._last_pushed = max(self._last_pushed, entry_id)
        now = self._last_activity = time.monotonic()
        at = entry_id - self._base
        entries = self._entries
        if at > len(entries):  # a caller-given id (ledger_adv) past new holes
            holes = at - len(entries)
            entries.extend([None] * holes)
            self._dones.extend([None] * holes)
            self._lengths.extend([0] * holes)
            self._pushed_at.extend([0.0] * holes)
        if at == len(entries):  # the next id: every add of a LedgerHandle
            entries.append(entry)
            self._dones.append(done)
            self._lengths.append(self._length)
            self._pushed_at.append(now)
        else:  # a caller-given id (ledger_adv) into a hole
            assert entries[at] is None, f"entry {entry_id} is pending already"
            entries[at], self._dones[at] = entry, done
            self._lengths[at], self._pushed_at[at] = self._length, now
        self._outstanding += 1
        write_set = self._metadata.write_set(entry_id)
        if not self._failed_bookies:
            return write_set
        return [b for b in write_set if b not in self._failed_bookies]

    def _push_run(self, first: int, entries: list[bytes], lengths: list[int],
                  done: AddDone) -> list[Sequence[str]]:
        """Put the adds of ``entries`` (ids from ``first``, the next id on) into their
        slots at once, ``done`` in the last one's; return, per ``entry_id % E``, the
        bookies to send them to now (as :meth:`_push`).  Caller holds the lock."""
        count = len(entries)
        assert first == self._base + len(self._entries), "a run of adds out of order"
        self._last_pushed = first + count - 1
        now = self._last_activity = time.monotonic()
        self._entries.extend(entries)
        self._dones.extend(itertools.repeat(None, count - 1))
        self._dones.append(done)
        self._lengths.extend(lengths)
        self._pushed_at.extend(itertools.repeat(now, count))
        self._outstanding += count
        layout = self._layout
        assert layout is not None
        failed = self._failed_bookies
        return [[b for b in write_set if b not in failed] if failed else write_set
                for write_set in layout.write_sets]

    def _awaits_acks(self) -> bool:
        """Whether a pending add can still be confirmed by bookies' answers alone: the
        first slot holds an add (always, unless ids are the caller's and one is
        missing).  Caller holds the lock."""
        return bool(self._entries) and self._entries[0] is not None

    def _check_can_add(self) -> None:
        if not self._writable or self._recovery:
            raise ReadOnlyLedger(f"ledger {self.id} was opened for reading")
        if self._bk.closed and self._state is _WriteState.OPEN:
            raise ClientClosed(f"ledger {self.id}: its BookKeeper client is closed (close "
                               "the ledger before the client)")
        cause = self._closed_by
        if cause is None:
            raise LedgerClosed(f"ledger {self.id} is closed")
        if isinstance(cause, (LedgerFenced, LedgerClosed)):
            raise type(cause)(str(cause))
        raise LedgerClosed(f"ledger {self.id} was closed after an error its writer could "
                           f"not recover from ({cause}); open it with recovery to read it")

    def _send(self, entry_id: int, entry: bytes, bookie_ids: Iterable[str]) -> None:
        """Send the add of ``entry_id`` to ``bookie_ids`` (the hot path: one call per
        entry, and per bookie one call of the transport's
        :meth:`~BookieClient.ledger_adds` sender when it has one).  The bookie's answer
        names the add by its entry id."""
        if entry_id < self._base:
            return  # finished while an ensemble change was re-sending it
        senders = self._senders
        for bookie_id in bookie_ids:
            send = senders.get(bookie_id)
            if send is None or not send(entry_id, entry, entry_id):
                self._send_to_client(bookie_id, entry_id, entry)

    def _send_to_client(self, bookie_id: str, entry_id: int, entry: bytes) -> None:
        """Send the add to the bookie's current client, keeping that client's sender for
        the next adds (if it has one)."""
        self._senders.pop(bookie_id, None)
        try:
            client = self._bk.bookie_client(bookie_id)
        except BookKeeperError as e:
            self._on_add_error(bookie_id, e)
            return
        sink = self._ack_sinks.get(bookie_id) or self._ack_sinks.setdefault(
            bookie_id, partial(self._on_acks, bookie_id))
        send = client.ledger_adds(self.id, self._master_key, sink, self._recovery,
                                  deferred=self._deferred)
        if send is not None and send(entry_id, entry, entry_id):
            self._senders[bookie_id] = send
        else:
            client.add_grouped(self.id, entry_id, entry, self._master_key, entry_id, sink,
                               self._recovery, deferred=self._deferred)

    def _on_acks(self, bookie_id: str, entry_ids: Sequence[int],
                 errors: Sequence[BaseException | None] | None) -> None:
        """A bookie answered adds (all durable when ``errors`` is None): one lock for
        all of them, however many the transport's reply carried, and per add a step of
        the bookie's watermark; the LAC is derived from the watermarks once per reply."""
        if errors is not None:
            failed = [e for e in errors if e is not None]
            if failed:
                self._on_add_error(bookie_id, failed[0])
                entry_ids = [e for e, error in zip(entry_ids, errors) if error is None]
        with self._lock:
            acks = self._acks
            if acks is not None:  # also late ones: a force may count this bookie
                for entry_id in entry_ids:
                    acks.acked(bookie_id, entry_id)
            known = self._through.get(bookie_id)
            if known is None or self._state is not _WriteState.OPEN:
                return  # a late answer from a replaced bookie, or the adds were decided
            gaps = self._layout.gaps[bookie_id]  # type: ignore[union-attr]
            size = len(gaps)
            through = known
            following = through + gaps[through % size]
            for entry_id in entry_ids:
                if entry_id == following:
                    through = entry_id
                    following = entry_id + gaps[entry_id % size]
                elif entry_id > following:  # past one not answered yet (or refused)
                    self._ahead.setdefault(bookie_id, set()).add(entry_id)
            if bookie_id in self._ahead:
                through = self._catch_up(bookie_id, through)
            if through == known:
                return
            self._through[bookie_id] = through
            if through < self._base:
                return  # nothing new to confirm: the bookie is behind the LAC
            self._confirm()
        self._completions.deliver()

    def _catch_up(self, bookie_id: str, through: int) -> int:
        """The bookie's watermark ``through`` raised over its acknowledgements ahead that
        now follow on from it; those at or below it forgotten.  Caller holds the lock."""
        ahead = self._ahead[bookie_id]
        gaps = self._layout.gaps[bookie_id]  # type: ignore[union-attr]
        size = len(gaps)
        following = through + gaps[through % size]
        while following in ahead:
            through = following
            following = through + gaps[through % size]
        ahead = {e for e in ahead if e > through}
        if ahead:
            self._ahead[bookie_id] = ahead
        else:
            del self._ahead[bookie_id]
        return through

    def _acked_through(self) -> int:
        """The highest entry id up to which every pending add has Qa acknowledgements
        from its write set, from the watermarks: an entry ``e`` of write set ``r`` is
        acknowledged by Qa bookies exactly when the Qa-th highest watermark of that
        write set's bookies reaches ``e`` (a watermark covers every entry of its
        bookie's write sets up to it).  With Qw = E there is one write set; with
        striping, the first entry not covered in any write set ends the run.  Caller
        holds the lock."""
        layout = self._layout
        assert layout is not None
        through, qa, floor = self._through, self._metadata.ack_quorum_size, self._base - 1
        if layout.full:
            return max(floor, sorted(through.values())[-qa])
        size = len(layout.write_sets)
        first_short = None
        for residue, write_set in enumerate(layout.write_sets):
            covered = max(floor, sorted(through[b] for b in write_set)[-qa])
            short = covered + 1 + (residue - covered - 1) % size  # next e, e % E == residue
            if first_short is None or short < first_short:
                first_short = short
        assert first_short is not None
        return first_short - 1

    def _on_add_error(self, bookie_id: str, error: BaseException) -> None:
        if isinstance(error, (LedgerFenced, Unauthorized)):
            self._unrecoverable(LedgerFenced(
                f"ledger {self.id} was fenced by a recovering client (bookie {bookie_id}: "
                f"{error})") if not self._recovery else LedgerRecoveryError(
                f"ledger {self.id}: bookie {bookie_id} refused a recovery add: {error}"))
            return
        if self._deferred:  # BookKeeper's rule: the adds past the durable LAC are lost
            if bookie_id in self._metadata.fragments[-1].ensemble:
                self._unrecoverable(BookKeeperError(
                    f"ledger {self.id}: bookie {bookie_id} failed an add ({error}); a "
                    "DEFERRED_SYNC ledger does not change its ensemble"))
            return
        with self._lock:
            if self._state is not _WriteState.OPEN or bookie_id in self._failed_bookies \
                    or bookie_id not in self._metadata.fragments[-1].ensemble:
                return  # closed, reported already, or a bookie replaced before
            self._failed_bookies.add(bookie_id)
            if self._bk.metrics is not None:
                self._bk.metrics.bookie_errors.labels(bookie_id).inc()
            log.warning("ledger %d: bookie %s failed an add (%s); changing the ensemble",
                        self.id, bookie_id, error)
            if self._changing_ensemble:
                return  # the change in flight picks it up
            self._changing_ensemble = True
        if not self._bk._run_in_background(self._change_ensemble):
            self._unrecoverable(BookKeeperError(f"ledger {self.id}: bookie {bookie_id} "
                                                "failed an add and the client is closed"))

    def _confirm(self) -> None:
        """Complete the adds now confirmed, in entry-id order (delivered by the caller
        with ``self._completions.deliver()``).  Caller holds the lock."""
        if self._changing_ensemble:
            return  # the change completes them once the new ensemble is in place
        # Raising the watermarks to the new LAC below may let a bookie's answers waiting
        # ahead count (its missing one is confirmed now): derive the LAC again then.
        while (count := self._acked_through() - self._base + 1) > 0:
            assert count <= len(self._entries) and self._lac == self._base - 1, \
                "adds confirmed out of order"
            dones = self._dones[:count]
            self._confirmed_length = self._lengths[count - 1]
            for slots in (self._entries, self._dones, self._lengths, self._pushed_at):
                del slots[:count]
            first = self._base
            self._base += count
            self._lac = self._base - 1
            self._outstanding -= count
            if self._throttled:
                self._bk._release_add_permits(count)
            self._completions.put_range(dones, first)
            # Watermarks count only above the LAC: one behind it (a bookie slow to answer,
            # or one past which its answers wait ahead) starts from the LAC again.
            floor = self._lac
            caught_up = False
            for bookie_id, through in self._through.items():
                if through < floor:
                    if bookie_id in self._ahead:
                        through = self._through[bookie_id] = self._catch_up(bookie_id, floor)
                        caught_up = caught_up or through > floor
                    else:
                        self._through[bookie_id] = floor
            if not caught_up:
                break
        if not self._awaits_acks():
            self._drained.notify_all()

    def _fail_pending(self, error: BookKeeperError) -> None:
        """Fail every pending add with ``error``, in entry-id order.  Caller holds the
        lock."""
        if self._outstanding:
            self._completions.put_range(self._dones, None, error)
            if self._throttled:
                self._bk._release_add_permits(self._outstanding)
        self._base = max(self._base, self._last_pushed + 1)
        self._entries, self._dones, self._lengths, self._pushed_at = [], [], [], []
        self._outstanding = 0
        self._drained.notify_all()

    def _unrecoverable(self, error: BookKeeperError) -> None:
        """An add can never succeed: fail the pending ones and decide the close at the
        LAC (as BookKeeper's writer does), writing CLOSED in the background unless a
        recoverer owns the metadata (fenced); recovery's handle just stops."""
        with self._lock:
            if self._state is not _WriteState.OPEN:
                return
            if self._recovery:
                self._state, self._closed_by = _WriteState.STOPPED, error
                self._fail_pending(error)
                write = False
            else:
                log.error("ledger %d: closing at entry %d: %s", self.id,
                          self.last_add_forced, error)
                self._decide_close(error, error)
                write = not isinstance(error, LedgerFenced)
        self._completions.deliver()
        if write and not self._bk._run_in_background(self._write_closed):
            self._metadata_closed.set_exception(BookKeeperError(  # type: ignore[union-attr]
                f"ledger {self.id}: the client is closed; the ledger stays open until it "
                "is recovered"))

    # -- ensemble change ----------------------------------------------------------

    def _change_ensemble(self) -> None:
        """Replace failed bookies, record the new fragment, re-send pending adds
        (on the client's worker)."""
        try:
            self._change_ensemble_until_done()
        except BookKeeperError as e:
            self._unrecoverable(e)
        except Exception as e:  # never leave adds hanging on an unexpected bug
            log.exception("ledger %d: ensemble change failed", self.id)
            self._unrecoverable(BookKeeperError(f"ensemble change failed: {e}"))
        finally:
            with self._lock:
                if self._state is not _WriteState.OPEN:
                    self._changing_ensemble = False

    def _change_ensemble_until_done(self) -> None:
        while True:
            with self._lock:
                if self._state is not _WriteState.OPEN:
                    return  # the close decided every pending add
                failed = set(self._failed_bookies)
                metadata, version = self._metadata, self._version
                first_entry = self._lac + 1
                shunned = failed | self._replaced
            changed = self._replace_bookies(metadata, failed, first_entry, shunned)
            new_version = self._record_change(changed, version)
            if new_version is None:
                continue  # lost a race with another metadata change: decide again
            log.info("ledger %d: ensemble change at entry %d: %s -> %s", self.id,
                     first_entry, list(metadata.fragments[-1].ensemble),
                     list(changed.fragments[-1].ensemble))
            self._bk.quarantine(failed)
            if self._bk.metrics is not None:
                self._bk.metrics.ensemble_changes.inc()
            with self._lock:
                self._adopt(changed, new_version)
                self._failed_bookies -= failed
                if self._recovery:
                    self._replaced |= failed
                for bookie_id in failed:
                    self._senders.pop(bookie_id, None)
                if self._state is not _WriteState.OPEN:
                    return
                resend = self._retarget_pending(changed)
                # More bookies of the new ensemble failed meanwhile: replace them too
                # (the replacements already in place get their adds now).
                more = bool(self._failed_bookies)
                if not more:
                    self._changing_ensemble = False
                    self._confirm()
            for entry_id, entry, bookie_ids in resend:
                self._send(entry_id, entry, bookie_ids)
            if more:
                continue
            self._completions.deliver()
            return

    def _replace_bookies(self, metadata: LedgerMetadata, failed: set[str],
                         first_entry: int, shunned: set[str]) -> LedgerMetadata:
        """``metadata`` with ``failed`` replaced in a fragment from ``first_entry`` on
        (the last fragment replaced in place if it starts there), by bookies outside
        ``shunned``.

        A writer shuns only the bookies failing now: one it replaced long ago may serve
        again (the client's quarantine keeps it out for a while).  Recovery also shuns
        every bookie it replaced before: it is short, and a bookie that refused its adds
        (read-only, disk full, silent) would refuse them again; choosing it back, when
        the quarantine lets it (too few other bookies, or no quarantine), would swap two
        refusing bookies for each other until recovery's wait ran out, instead of
        failing at once with NotEnoughBookies."""
        ensemble = metadata.fragments[-1].ensemble
        replacements = self._bk.choose_replacements(
            self.id, ensemble, [i for i, b in enumerate(ensemble) if b in failed],
            metadata.write_quorum_size, exclude=shunned)
        new_ensemble = tuple(replacements.pop(0) if b in failed else b for b in ensemble)
        fragments = list(metadata.fragments)
        if fragments[-1].first_entry_id == first_entry:
            fragments[-1] = Fragment(first_entry, new_ensemble)
        else:
            fragments.append(Fragment(first_entry, new_ensemble))
        return dataclasses.replace(metadata, fragments=tuple(fragments))

    def _record_change(self, changed: LedgerMetadata, version: int) -> int | None:
        """Make the new fragment the ledger's: compare-and-set as the writer (None after
        a lost race, with the current metadata adopted), in memory in recovery mode
        (recovery writes it with the CLOSED state)."""
        if self._recovery:
            return version
        try:
            return self._bk.ledger_manager.update(changed, version)
        except BadVersion:
            current = self._bk.ledger_manager.read(self.id)
            if current.metadata.state is not LedgerState.OPEN:
                raise self._lost_ledger(current.metadata) from None
            with self._lock:
                self._adopt(*current)
            return None

    def _retarget_pending(self, changed: LedgerMetadata
                          ) -> list[tuple[int, bytes, list[str]]]:
        """Take ``changed``'s last ensemble for the acknowledgements: the replaced
        bookies' watermarks go (their late answers count for nothing), each replacement
        starts at the LAC, with its timeouts counted from now; return, per pending add,
        its entry id, entry and the replacements of its write set to send it to.  Caller
        holds the lock."""
        layout = self._layout = _AckLayout(changed)
        old, floor, now = self._through, self._base - 1, time.monotonic()
        self._through = {b: old.get(b, floor) for b in layout.ensemble}
        joined = {b for b in layout.ensemble if b not in old}
        for bookie_id in old.keys() - self._through.keys():
            self._ahead.pop(bookie_id, None)
            self._since.pop(bookie_id, None)
        for bookie_id in joined:
            self._since[bookie_id] = now
        resend = []
        size = len(layout.write_sets)
        for entry_id, entry in enumerate(self._entries, self._base):
            if entry is not None:
                targets = [b for b in layout.write_sets[entry_id % size] if b in joined]
                if targets:
                    resend.append((entry_id, entry, targets))
        return resend

    def _adopt(self, metadata: LedgerMetadata, version: int) -> None:
        """Take ``metadata`` as the ledger's unless a newer version is known already
        (writes land in any order).  Caller holds the lock."""
        if version >= self._version:
            self._metadata, self._version = metadata, version

    def _lost_ledger(self, current: LedgerMetadata) -> BookKeeperError:
        if current.state is LedgerState.IN_RECOVERY:
            return LedgerFenced(f"ledger {self.id} is being recovered by another client")
        return LedgerClosed(f"ledger {self.id} was closed by another client")

    # -- timeouts and explicit LAC (driven by the client's timer thread) -------------

    def _tick(self, now: float) -> None:
        """Time out adds the bookies did not answer; send an explicit LAC when idle."""
        settings = self._bk.settings
        with self._lock:
            late = self._late_bookies(now, settings.addEntryTimeout)
            idle = not self._outstanding and now - self._last_activity \
                >= settings.explicitLacInterval / 1000.0
            send_lac = (settings.explicitLacInterval > 0 and idle and not self._recovery
                        and self._state is _WriteState.OPEN
                        and self.last_add_forced > self._lac_sent)
            lac, ensemble = self.last_add_forced, self._metadata.fragments[-1].ensemble
            if send_lac:
                self._lac_sent = lac
        for bookie_id in late:
            self._on_add_error(bookie_id, Timeout(f"no answer to an add within "
                                                  f"addEntryTimeout={settings.addEntryTimeout}"))
        if send_lac:
            for bookie_id in ensemble:
                self._bk.bookie_client(bookie_id).write_lac(self.id, lac, self._master_key)

    def _late_bookies(self, now: float, timeout: float) -> set[str]:
        """The bookies whose oldest unanswered pending add was sent over ``timeout``
        seconds ago (sent when pushed, or when the bookie joined the ensemble if that was
        later).  Ids in order: a bookie's oldest unanswered add is the first of its write
        sets past its watermark, one look per bookie; caller-given ids are pushed in any
        order, so their bookies' unanswered adds are all looked at (the slower general
        path, off the add path: the client's timer).  Caller holds the lock."""
        late: set[str] = set()
        layout = self._layout
        if layout is None or not self._outstanding:
            return late
        base, entries, pushed_at = self._base, self._entries, self._pushed_at
        end = base + len(entries)
        for bookie_id, through in self._through.items():
            if bookie_id in self._failed_bookies:
                continue  # being replaced already
            gaps, size = layout.gaps[bookie_id], len(layout.gaps[bookie_id])
            ahead = self._ahead.get(bookie_id, ())
            since = self._since.get(bookie_id, 0.0)
            entry_id = max(through, base - 1)
            while True:
                entry_id += gaps[entry_id % size]
                if entry_id >= end:
                    break
                if entries[entry_id - base] is None or entry_id in ahead:
                    continue
                if now - max(pushed_at[entry_id - base], since) > timeout:
                    late.add(bookie_id)
                    break
                if self._ids_in_order:
                    break  # pushed in order: the later ones were sent later
        return late

    # -- deferred sync --------------------------------------------------------------

    def force(self) -> int:
        """Make every add acknowledged so far durable on Qa bookies; return the durable
        LAC (see :meth:`force_async`).  Waits up to 2 x addEntryTimeout (Timeout)."""
        timeout = self._bk.settings.addEntryTimeout * 2
        try:
            return self.force_async().result(timeout=timeout)
        except FutureTimeout:
            raise Timeout(f"ledger {self.id}: force not answered within {timeout} s") \
                from None

    def force_async(self) -> Future:
        """FORCE_LEDGER to the bookies of the acknowledged entries' write sets (BookKeeper's
        ``force()``); the future gives the durable LAC once every entry acknowledged
        before the call is fdatasync'd on Qa bookies of its write set that acknowledged
        it (:mod:`pybk.client.deferred`), or fails (the durable LAC stays where it was;
        LedgerClosed if the close was decided, at the durable LAC of then, before the
        force completed: a force never moves the durable LAC past the close).  A
        ledger without DEFERRED_SYNC is durable at every acknowledgement: its future
        gives the LAC at once."""
        future: Future = Future()
        if self._bk.metrics is not None:
            self._bk.metrics.time_future("FORCE", future)
        with self._lock:
            if self._state is not _WriteState.OPEN or not self._writable or self._recovery:
                self._check_can_add()
            target, length, forced = self._lac, self._confirmed_length, self._forced
            metadata = self._metadata
        if not self._deferred or target <= forced:
            future.set_result(self.last_add_forced)
            return future
        assert len(metadata.fragments) == 1, "a DEFERRED_SYNC ledger changed its ensemble"
        acks = self._acks
        assert acks is not None

        def done(error: BaseException | None) -> None:
            if error is not None:
                future.set_exception(error)
                return
            with self._lock:
                forced = self._forced
                if target > forced and self._state is not _WriteState.OPEN:
                    # The close was decided at the durable LAC of then (and may be
                    # written already): a force landing after it must not pass it.
                    error = LedgerClosed(f"ledger {self.id} was closed at entry {forced} "
                                         f"before the force of entries up to {target} "
                                         "completed")
                elif target > forced:
                    self._forced, self._forced_length = target, length
                    forced = target
            if error is not None:
                future.set_exception(error)
                return
            future.set_result(forced)

        # The last E entries of the range: one per write set, each covering the earlier
        # entries of its write set (a bookie counts up to a watermark).
        size = metadata.ensemble_size
        force = ForceOp([(e, metadata.write_set(e))
                         for e in range(max(forced, target - size) + 1, target + 1)],
                        entries_stored([metadata.write_set(i) for i in range(size)],
                                       forced + 1, target),
                        metadata.ack_quorum_size, acks.through, done)

        def send() -> None:
            for bookie_id in force.bookies:
                try:
                    answer = self._bk.bookie_client(bookie_id).force_ledger(
                        self.id, forced + 1, target)
                except BookKeeperError as e:
                    answer = failed_future(e)
                answer.add_done_callback(partial(force.answer, bookie_id))

        # An entry up to the target may be acknowledged by Qa bookies while its adder's
        # thread still sends it to the others: the force goes after those sends (a
        # bookie answers a force after the adds it received before), else it would
        # count them short of entries they are about to get.
        with self._lock:
            if self._sending and min(self._sending) <= target:
                self._forces_waiting.append((target, send))
                return future
        send()
        return future

    # -- closing ------------------------------------------------------------------

    def close(self) -> None:
        """As the writer: wait (up to 2 x addEntryTimeout) for pending adds, then close
        at the LAC: adds still pending fail with LedgerClosed, and the metadata is
        compare-and-set to CLOSED.  A DEFERRED_SYNC writer forces first and closes at the
        durable LAC.  Returns once the callbacks of this handle's adds were delivered.
        As a reader: release the handle."""
        if self._recovery:  # recovery is done with its re-writes, or gave up on them
            with self._lock:
                if self._state is _WriteState.OPEN:
                    self._state = _WriteState.STOPPED
                    self._fail_pending(LedgerRecoveryError(f"ledger {self.id}: recovery "
                                                           "stopped"))
            self._completions.deliver()
            self._bk._unregister_writer(self)
        if not self._writable or self._recovery:
            self._reader_closed = True
            return
        deadline = time.monotonic() + self._bk.settings.addEntryTimeout * 2
        with self._lock:
            while self._awaits_acks() and self._state is _WriteState.OPEN \
                    and time.monotonic() < deadline:
                self._drained.wait(max(0.0, deadline - time.monotonic()))
        if self._deferred and self._state is _WriteState.OPEN:
            try:
                self.force_async().result(timeout=max(0.0, deadline - time.monotonic()))
            except (BookKeeperError, FutureTimeout) as e:
                log.warning("ledger %d: force before close failed (%s); closing at the "
                            "durable entry %d", self.id, str(e) or "timeout", self._forced)
        with self._lock:
            decided = self._state is _WriteState.OPEN
            if decided:
                self._decide_close(LedgerClosed(f"ledger {self.id} was closed before this "
                                                "add was acknowledged"), None)
        self._completions.deliver()
        if decided:
            self._write_closed()
        self._completions.wait_delivered(self._bk.settings.addEntryTimeout)
        if isinstance(self._closed_by, LedgerFenced):
            self._confirm_closed_by_recovery(self.last_add_forced)
            return
        assert self._metadata_closed is not None
        self._metadata_closed.result()

    def _decide_close(self, pending_error: BookKeeperError,
                      cause: BookKeeperError | None) -> None:
        """Fix the last entry at the LAC and fail the pending adds.  Caller holds the
        lock and has checked that the handle is OPEN."""
        self._state, self._closed_by = _WriteState.CLOSED, cause
        self._fail_pending(pending_error)
        self._metadata_closed = Future()
        self._bk._unregister_writer(self)

    def _write_closed(self) -> None:
        """Compare-and-set the metadata to CLOSED at the decided last entry; the outcome
        goes to ``self._metadata_closed``."""
        result = self._metadata_closed
        assert result is not None
        try:
            if self._deferred:
                self._close_metadata(self._forced, self._forced_length)
            else:
                self._close_metadata(self._lac, self._confirmed_length)
        except BookKeeperError as e:
            result.set_exception(e)
        except Exception as e:  # never leave close() waiting on an unexpected bug
            log.exception("ledger %d: closing the metadata failed", self.id)
            result.set_exception(BookKeeperError(f"ledger {self.id}: closing failed: {e}"))
        else:
            result.set_result(None)

    def _close_metadata(self, lac: int, length: int) -> None:
        with self._lock:
            metadata, version = self._metadata, self._version
        while True:
            closed = dataclasses.replace(metadata, state=LedgerState.CLOSED,
                                         last_entry_id=lac, length=length)
            try:
                new_version = self._bk.ledger_manager.update(closed, version)
            except BadVersion:
                current, version = self._bk.ledger_manager.read(self.id)
                if current.state is LedgerState.OPEN:
                    metadata = current
                    continue
                with self._lock:
                    self._adopt(current, version)
                if current.state is LedgerState.CLOSED and current.last_entry_id == lac:
                    return
                raise self._lost_ledger(current) from None
            with self._lock:
                self._adopt(closed, new_version)
            return

    def _confirm_closed_by_recovery(self, lac: int) -> None:
        """A fenced writer's close: recovery owns the metadata now; the close is fine if
        recovery closed the ledger where this writer would have."""
        current, version = self._bk.ledger_manager.read(self.id)
        with self._lock:
            self._adopt(current, version)
        if current.state is LedgerState.CLOSED and current.last_entry_id == lac:
            return
        raise self._closed_by  # type: ignore[misc]

    # -- reading ------------------------------------------------------------------

    def read_entries(self, first: int, last: int) -> Iterator[LedgerEntry]:
        """Entries ``first..last`` (inclusive), in order, digests verified; ``last`` must
        not be past the LAC (or the last entry of a closed ledger).  The range is read
        ahead, many entries per request and several requests in flight, with
        ``read_entry``'s failover (:mod:`pybk.client.reads`)."""
        limit = self._readable_limit()
        _check_range(first, last)
        if last > limit:
            raise NoSuchEntry(f"ledger {self.id}: entry {last} is past the last readable "
                              f"entry {limit}")
        return self._read_range(first, last)

    def read_unconfirmed(self, first: int, last: int) -> Iterator[LedgerEntry]:
        """Entries ``first..last`` (inclusive) as the bookies hold them, also past the
        LAC (BookKeeper's ``readUnconfirmedEntries``): read and verified as
        :meth:`read_entries` does, without checking ``last`` against the LAC.

        Beyond the LAC the writer may not have had an entry acknowledged yet (and, if it
        dies, recovery may leave the entry out): only entries up to the LAC are
        guaranteed to stay.  An entry that every bookie of its write set says it does not
        hold raises NoSuchEntry, after the entries before it.  A closed ledger is never
        read past its last entry (NoSuchEntry at once)."""
        _check_range(first, last)
        metadata = self._metadata
        if metadata.state is LedgerState.CLOSED and last > metadata.closed_last_entry_id():
            raise NoSuchEntry(f"ledger {self.id} is closed at entry "
                              f"{metadata.closed_last_entry_id()}: it has no entry {last}")
        return self._read_range(first, last)

    def _read_range(self, first: int, last: int) -> Iterator[LedgerEntry]:
        metrics = self._bk.metrics
        return iter(RangeRead(self._metadata, self._digest, self._bk.bookie_client,
                              self._bk.settings.readTimeout, first, last,
                              None if metrics is None else metrics.reads_done))

    def _readable_limit(self) -> int:
        metadata = self._metadata
        if metadata.state is LedgerState.CLOSED:
            return metadata.closed_last_entry_id()
        return self._lac

    def read_entry(self, entry_id: int, fence: bool = False) -> LedgerEntry:
        """One entry, from the first bookie of its write set that has a valid copy."""
        with timing(self._bk.metrics, "READ_ENTRY"):
            return self._read_one(entry_id, fence)

    def _read_one(self, entry_id: int, fence: bool) -> LedgerEntry:
        errors: list[BaseException] = []
        for bookie_id in self._metadata.write_set(entry_id):
            data = self._ask(bookie_id, entry_id, fence, errors)
            if data is None:
                continue
            try:
                return self._digest.decode(entry_id, data)
            except DigestMismatch as e:
                log.warning("ledger %d entry %d: bad copy on %s (%s)", self.id, entry_id,
                            bookie_id, e)
                errors.append(e)
        raise read_error(self.id, entry_id, errors)

    def _ask(self, bookie_id: str, entry_id: int, fence: bool,
             errors: list[BaseException]) -> bytes | None:
        future = self._bk.bookie_client(bookie_id).read(self.id, entry_id, fence,
                                                        self._master_key)
        try:
            return future.result(timeout=self._bk.settings.readTimeout)
        except FutureTimeout:
            errors.append(Timeout(f"bookie {bookie_id} did not answer within "
                                  f"readTimeout={self._bk.settings.readTimeout}"))
        except BookKeeperError as e:
            errors.append(e)
        return None

    def read_last_add_confirmed(self) -> int:
        """Ask the bookies of the last fragment for the LAC, all at once (one wait for
        their answers, within ``readTimeout``); the highest answer wins."""
        with timing(self._bk.metrics, "READ_LAC"):
            return self._read_lac()

    def _read_lac(self) -> int:
        if self._metadata.state is LedgerState.CLOSED:
            return self._metadata.closed_last_entry_id()
        asked = [self._read_lac_of(b) for b in self._metadata.fragments[-1].ensemble]
        deadline = time.monotonic() + self._bk.settings.readTimeout
        answers = []
        for future in asked:
            try:
                answers.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
            except (BookKeeperError, FutureTimeout):
                continue
        with self._lock:
            if answers and max(answers) > self._lac:
                self._lac = max(answers)
            return self._lac

    def try_read_last_add_confirmed(self) -> int:
        """The LAC as the first bookie to know more than this handle says it (BookKeeper's
        ``tryReadLastAddConfirmed``): fast, and possibly behind the LAC that
        :meth:`read_last_add_confirmed` would find.

        Every bookie of the last fragment is asked at once; the first answer past the
        handle's LAC is taken (and becomes the handle's LAC) and returned.  If none is
        past it, the handle's LAC is returned once every bookie answered or
        ``readTimeout`` passed, provided one bookie answered (a bookie without the ledger
        or its entries answers too); if none did, BookKeeperError.  A closed ledger's
        answer is its last entry, without asking."""
        with timing(self._bk.metrics, "READ_LAC"):
            return self._try_read_lac()

    def _try_read_lac(self) -> int:
        metadata = self._metadata
        if metadata.state is LedgerState.CLOSED:
            return metadata.closed_last_entry_id()
        with self._lock:
            known = self._lac
        asked = {self._read_lac_of(b): b for b in metadata.fragments[-1].ensemble}
        errors: list[str] = []
        answered = False
        try:
            for future in as_completed(asked, timeout=self._bk.settings.readTimeout):
                try:
                    lac = future.result()
                except (NoSuchLedger, NoSuchEntry):
                    answered = True
                    continue
                except BookKeeperError as e:
                    errors.append(f"{asked[future]}: {e}")
                    continue
                answered = True
                if lac > known:
                    with self._lock:
                        self._lac = max(self._lac, lac)
                    return lac
        except FutureTimeout:
            errors.append(f"no answer within readTimeout={self._bk.settings.readTimeout}")
        if not answered:
            raise BookKeeperError(f"ledger {self.id}: no bookie of the last ensemble told "
                                  "its LAC: " + "; ".join(errors))
        return known

    def _read_lac_of(self, bookie_id: str) -> Future:
        try:
            return self._bk.bookie_client(bookie_id).read_lac(self.id)
        except BookKeeperError as e:  # a bookie this client cannot reach now
            return failed_future(e)

    def read_last_add_confirmed_and_entry(self, timeout: float
                                          ) -> tuple[int, LedgerEntry | None]:
        """Long poll: wait up to ``timeout`` seconds for the LAC to move past the one
        known now; return the new LAC and that entry (or the old LAC and None)."""
        with timing(self._bk.metrics, "READ_LAST_CONFIRMED_AND_ENTRY"):
            return self._long_poll(timeout)

    def _long_poll(self, timeout: float) -> tuple[int, LedgerEntry | None]:
        known = self._lac
        deadline = time.monotonic() + timeout
        pause = 0.0005
        while True:
            lac = self._read_lac()
            if lac > known:
                return lac, self._read_one(lac, False)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._metadata.state is LedgerState.CLOSED:
                return lac, None
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 0.01)


def _check_range(first: int, last: int) -> None:
    if first < 0 or last < first:
        raise ValueError(f"bad entry range {first}..{last}")


__all__ = ["LedgerHandle", "LedgerEntry"]
