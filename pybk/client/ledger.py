"""A ledger handle: the writer's quorum protocol and the reader's failover.

Writing (DESIGN.md, "The model"): entry *e* goes to its write set (the Qw bookies of the
ensemble from index ``e % E``); it succeeds once Qa of them acknowledged it durably, and
is confirmed to the caller only after every lower entry was, so the LAC (carried on every
entry) only moves forward.  A bookie that fails an add (error or ``addEntryTimeout``) is
replaced by an ensemble change: a new fragment starts at LAC + 1 (or replaces the last
fragment in place if that is where it starts), the metadata is compare-and-set, pending
entries are re-sent to the new bookies, and no add completes while the change is in
flight.  A fenced bookie's answer fails every pending add with LedgerFenced: another
client is recovering the ledger.

Reading: an entry is asked of the bookies of its write set in turn, moving on after an
error, a digest mismatch or ``readTimeout``; every entry's digest is verified.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional, Sequence

from pybk.client.digest import DecodedEntry, DigestManager
from pybk.client.transport import AddsDone, LedgerAdds
from pybk.errors import (BadVersion, BookKeeperError, DigestMismatch, EntryTooLarge,
                         LedgerClosed, LedgerFenced, NoSuchEntry, NoSuchLedger,
                         ReadOnlyLedger, Timeout, Unauthorized)
from pybk.meta.ledger_metadata import Fragment, LedgerMetadata, LedgerState
from pybk.meta.ledgers import Versioned

if TYPE_CHECKING:
    from pybk.client.bookkeeper import BookKeeper

log = logging.getLogger(__name__)

LedgerEntry = DecodedEntry  # what readers get: entry_id, last_add_confirmed, length, data


AddDone = Callable[[Optional[int], Optional[BaseException]], None]


class _PendingAdd:
    __slots__ = ("entry_id", "entry", "length", "done", "write_set", "acked", "sent_at")

    def __init__(self, entry_id: int, entry: bytes, length: int, done: AddDone,
                 write_set: tuple[str, ...], sent_at: float) -> None:
        self.entry_id = entry_id
        self.entry = entry
        self.length = length
        self.done = done            # called once: (entry id, None) or (None, error)
        self.write_set = write_set  # the bookies it goes to (changes with the ensemble)
        self.acked: set[str] = set()
        self.sent_at = sent_at      # when it was last sent (adds are sent in entry order)


def _settle(future: Future) -> AddDone:
    """An :data:`AddDone` that completes ``future`` (unless it was cancelled)."""
    def done(entry_id: int | None, error: BaseException | None) -> None:
        if future.set_running_or_notify_cancel():
            if error is None:
                future.set_result(entry_id)
            else:
                future.set_exception(error)
    return done


class LedgerHandle:
    """One open ledger, as its writer (``writable``) or as a reader."""

    def __init__(self, bk: "BookKeeper", versioned: Versioned, password: bytes,
                 writable: bool, last_add_confirmed: int = -1) -> None:
        self._bk = bk
        self._metadata, self._version = versioned
        self.id = self._metadata.ledger_id
        self._digest = DigestManager(self.id, self._metadata.digest_type, password)
        self._max_payload = bk.settings.maxEntrySizeBytes - self._digest.overhead
        self._master_key = bk.master_key(password)
        self._writable = writable
        self._lock = threading.RLock()
        self._drained = threading.Condition(self._lock)  # pending adds all finished
        self._pending: collections.deque[_PendingAdd] = collections.deque()
        self._lac = last_add_confirmed
        self._last_pushed = last_add_confirmed
        self._length = 0
        self._confirmed_length = 0
        self._changing_ensemble = False
        self._failed_bookies: set[str] = set()
        self._fatal: BookKeeperError | None = None
        self._closed = False
        self._lac_sent = last_add_confirmed
        self._ack_sinks: dict[str, AddsDone] = {}  # per bookie: see BookieClient.add_grouped
        # Per bookie, its client's sender (BookieClient.ledger_adds): the add path's one
        # call per bookie.  Dropped when it refuses, and for bookies replaced.
        self._senders: dict[str, LedgerAdds] = {}
        self._last_activity = time.monotonic()
        if writable:
            bk._register_writer(self)

    # -- properties ---------------------------------------------------------------

    @property
    def metadata(self) -> LedgerMetadata:
        return self._metadata

    @property
    def last_add_confirmed(self) -> int:
        """The highest entry id known to be acknowledged (-1: none)."""
        return self._lac

    @property
    def length(self) -> int:
        """Bytes of payload confirmed so far (for a closed ledger: all of them)."""
        return self._confirmed_length

    @property
    def is_closed(self) -> bool:
        return self._closed or self._metadata.state is LedgerState.CLOSED

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
        ``done(None, error)``.  Calls come in entry-id order, on whichever thread
        completed the add (keep ``done`` short and non-blocking)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"entry data must be bytes, not {type(data).__name__}")
        if len(data) > self._max_payload:  # refused here: no bookie would take it
            raise EntryTooLarge(f"entry of {len(data)} bytes is over the {self._max_payload} "
                                f"bytes an entry can carry (maxEntrySizeBytes="
                                f"{self._bk.settings.maxEntrySizeBytes}, less the "
                                f"{self._digest.overhead}-byte entry header)")
        with self._lock:
            if self._fatal is not None or self._closed or not self._writable:
                self._check_can_add()
            entry_id = self._last_pushed + 1
            self._last_pushed = entry_id
            self._length += len(data)
            now = time.monotonic()
            op = _PendingAdd(entry_id, self._digest.encode(entry_id, self._lac, self._length,
                                                           data), self._length, done,
                             self._metadata.write_set(entry_id), now)
            self._pending.append(op)
            self._last_activity = now
            if self._changing_ensemble:
                return  # the change sends it once the new ensemble is in place
        self._send(op, op.write_set)

    def _check_can_add(self) -> None:
        if not self._writable:
            raise ReadOnlyLedger(f"ledger {self.id} was opened for reading")
        if self._fatal is not None:
            raise self._fatal
        if self._closed:
            raise LedgerClosed(f"ledger {self.id} is closed")

    def _send(self, op: _PendingAdd, bookie_ids: Iterable[str]) -> None:
        """Send ``op`` to ``bookie_ids`` (the hot path: one call per entry, and per
        bookie one call of the transport's :meth:`~BookieClient.ledger_adds` sender
        when it has one)."""
        entry = op.entry
        if entry is None:
            return  # finished while an ensemble change was re-sending it
        senders = self._senders
        for bookie_id in bookie_ids:
            send = senders.get(bookie_id)
            if send is None or not send(op.entry_id, entry, op):
                self._send_to_client(bookie_id, op, entry)

    def _send_to_client(self, bookie_id: str, op: _PendingAdd, entry: bytes) -> None:
        """Send ``op`` to the bookie's current client, keeping that client's sender for
        the next adds (if it has one)."""
        self._senders.pop(bookie_id, None)
        try:
            client = self._bk.bookie_client(bookie_id)
        except BookKeeperError as e:
            self._on_add_error(bookie_id, e)
            return
        sink = self._ack_sinks.get(bookie_id) or self._ack_sinks.setdefault(
            bookie_id, partial(self._on_acks, bookie_id))
        send = client.ledger_adds(self.id, self._master_key, sink)
        if send is not None and send(op.entry_id, entry, op):
            self._senders[bookie_id] = send
        else:
            client.add_grouped(self.id, op.entry_id, entry, self._master_key, op, sink)

    def _on_acks(self, bookie_id: str, ops: Sequence[_PendingAdd],
                 errors: Sequence[BaseException | None] | None) -> None:
        """A bookie answered adds (all durable when ``errors`` is None): one lock for
        all of them, however many the transport's reply carried."""
        if errors is not None:
            failed = [e for e in errors if e is not None]
            if failed:
                self._on_add_error(bookie_id, failed[0])
                ops = [op for op, error in zip(ops, errors) if error is None]
        with self._lock:
            for op in ops:
                # skipped: finished already, or a late answer from a replaced bookie
                if op.entry is not None and bookie_id in op.write_set:
                    op.acked.add(bookie_id)
            pending = self._pending
            if not pending or len(pending[0].acked) < self._metadata.ack_quorum_size:
                return  # nothing new to confirm: the first pending add is short of Qa
            confirmed = self._take_confirmed()
        self._complete(confirmed)

    def _on_add_error(self, bookie_id: str, error: BaseException) -> None:
        if isinstance(error, (LedgerFenced, Unauthorized)):
            self._fail_all(LedgerFenced(f"ledger {self.id} was fenced by a recovering "
                                        f"client (bookie {bookie_id}: {error})"))
            return
        with self._lock:
            if self._fatal is not None or bookie_id in self._failed_bookies:
                return  # reported once per bookie, not once per pending add
            self._failed_bookies.add(bookie_id)
            log.warning("ledger %d: bookie %s failed an add (%s); changing the ensemble",
                        self.id, bookie_id, error)
            if self._changing_ensemble:
                return  # the change in flight picks it up
            self._changing_ensemble = True
        if not self._bk._run_in_background(self._change_ensemble):
            self._fail_all(BookKeeperError(f"ledger {self.id}: bookie {bookie_id} failed an "
                                           "add and the client is closed"))

    def _take_confirmed(self) -> list[_PendingAdd]:
        """Pop the adds now confirmed, in entry-id order.  Caller holds the lock."""
        confirmed = []
        qa = self._metadata.ack_quorum_size
        while self._pending and not self._changing_ensemble \
                and len(self._pending[0].acked) >= qa:
            op = self._pending.popleft()
            op.entry = None  # finished: late answers are ignored
            self._lac = op.entry_id
            self._confirmed_length = op.length
            confirmed.append(op)
        if confirmed and not self._pending:
            self._drained.notify_all()
        return confirmed

    @staticmethod
    def _complete(confirmed: list[_PendingAdd]) -> None:
        for op in confirmed:
            op.done(op.entry_id, None)

    def _fail_all(self, error: BookKeeperError) -> None:
        with self._lock:
            if self._fatal is None:
                self._fatal = error
            failed = list(self._pending)
            self._pending.clear()
            for op in failed:
                op.entry = None
            self._drained.notify_all()
        for op in failed:
            op.done(None, error)

    # -- ensemble change ----------------------------------------------------------

    def _change_ensemble(self) -> None:
        """Replace failed bookies, CAS the metadata, re-send pending adds (background)."""
        try:
            self._change_ensemble_until_done()
        except BookKeeperError as e:
            self._fail_all(e)
        except Exception as e:  # never leave adds hanging on an unexpected bug
            log.exception("ledger %d: ensemble change failed", self.id)
            self._fail_all(BookKeeperError(f"ensemble change failed: {e}"))

    def _change_ensemble_until_done(self) -> None:
        while True:
            with self._lock:
                failed = set(self._failed_bookies)
                metadata, version = self._metadata, self._version
                first_entry = self._lac + 1
            ensemble = list(metadata.fragments[-1].ensemble)
            failed_members = [b for b in ensemble if b in failed]
            replacements = self._bk.choose_replacements(
                self.id, len(failed_members), exclude=set(ensemble) | failed)
            new_ensemble = tuple(replacements.pop(0) if b in failed else b for b in ensemble)
            fragments = list(metadata.fragments)
            if fragments[-1].first_entry_id == first_entry:
                fragments[-1] = Fragment(first_entry, new_ensemble)
            else:
                fragments.append(Fragment(first_entry, new_ensemble))
            changed = dataclasses.replace(metadata, fragments=tuple(fragments))
            try:
                new_version = self._bk.ledger_manager.update(changed, version)
            except BadVersion:
                current = self._bk.ledger_manager.read(self.id)
                if current.metadata.state is not LedgerState.OPEN:
                    raise self._lost_ledger(current.metadata) from None
                with self._lock:
                    self._metadata, self._version = current
                continue
            log.info("ledger %d: ensemble change at entry %d: %s -> %s", self.id, first_entry,
                     ensemble, list(new_ensemble))
            with self._lock:
                self._metadata, self._version = changed, new_version
                self._failed_bookies -= failed
                for bookie_id in failed:
                    self._senders.pop(bookie_id, None)
                if self._failed_bookies & set(new_ensemble):
                    continue  # more bookies failed meanwhile: change again
                self._failed_bookies.clear()
                self._changing_ensemble = False
                resend = []
                now = time.monotonic()
                for op in self._pending:
                    op.write_set = changed.write_set(op.entry_id)
                    op.acked &= set(op.write_set)
                    op.sent_at = now
                    resend.append((op, [b for b in op.write_set if b not in op.acked]))
                confirmed = self._take_confirmed()
            for op, bookie_ids in resend:
                self._send(op, bookie_ids)
            self._complete(confirmed)
            return

    def _lost_ledger(self, current: LedgerMetadata) -> BookKeeperError:
        if current.state is LedgerState.IN_RECOVERY:
            return LedgerFenced(f"ledger {self.id} is being recovered by another client")
        return LedgerClosed(f"ledger {self.id} was closed by another client")

    # -- timeouts and explicit LAC (driven by the client's timer thread) -------------

    def _tick(self, now: float) -> None:
        """Time out adds the bookies did not answer; send an explicit LAC when idle."""
        settings = self._bk.settings
        with self._lock:
            late: set[str] = set()
            for op in self._pending:  # sent in entry order: the late ones come first
                if now - op.sent_at <= settings.addEntryTimeout:
                    break
                late.update(b for b in op.write_set if b not in op.acked)
            idle = not self._pending and now - self._last_activity \
                >= settings.explicitLacInterval / 1000.0
            send_lac = (settings.explicitLacInterval > 0 and idle and self._writable
                        and not self._closed and self._lac > self._lac_sent)
            lac, ensemble = self._lac, self._metadata.fragments[-1].ensemble
            if send_lac:
                self._lac_sent = lac
        for bookie_id in late:
            self._on_add_error(bookie_id, Timeout(f"no answer to an add within "
                                                  f"addEntryTimeout={settings.addEntryTimeout}"))
        if send_lac:
            for bookie_id in ensemble:
                self._bk.bookie_client(bookie_id).write_lac(self.id, lac, self._master_key)

    # -- closing ------------------------------------------------------------------

    def close(self) -> None:
        """As the writer: wait for pending adds, then CAS the metadata to CLOSED at the
        LAC.  As a reader: release the handle."""
        if self._closed:
            return
        if not self._writable:
            self._closed = True
            return
        deadline = time.monotonic() + self._bk.settings.addEntryTimeout * 2
        with self._lock:
            # Adds still pending at the deadline are decided by the close below (or by
            # recovery): they end up confirmed or not, as the LAC closed at says.
            while self._pending and time.monotonic() < deadline:
                self._drained.wait(max(0.0, deadline - time.monotonic()))
            self._closed = True
            lac, length = self._lac, self._confirmed_length
        self._bk._unregister_writer(self)
        if self._fatal is not None and isinstance(self._fatal, LedgerFenced):
            self._close_metadata_after_fence(lac)
            return
        self._close_metadata(lac, length)

    def _close_metadata(self, lac: int, length: int) -> None:
        metadata, version = self._metadata, self._version
        while True:
            closed = dataclasses.replace(metadata, state=LedgerState.CLOSED,
                                         last_entry_id=lac, length=length)
            try:
                self._version = self._bk.ledger_manager.update(closed, version)
                self._metadata = closed
                return
            except BadVersion:
                current, version = self._bk.ledger_manager.read(self.id)
                if current.state is LedgerState.OPEN:
                    metadata = current
                    continue
                self._metadata, self._version = current, version
                if current.state is LedgerState.CLOSED and current.last_entry_id == lac:
                    return
                raise self._lost_ledger(current) from None

    def _close_metadata_after_fence(self, lac: int) -> None:
        current, version = self._bk.ledger_manager.read(self.id)
        self._metadata, self._version = current, version
        if current.state is LedgerState.CLOSED and current.last_entry_id == lac:
            return
        raise self._fatal  # type: ignore[misc]

    # -- reading ------------------------------------------------------------------

    def read_entries(self, first: int, last: int) -> Iterator[LedgerEntry]:
        """Entries ``first..last`` (inclusive), digests verified; ``last`` must not be past
        the LAC (or the last entry of a closed ledger)."""
        limit = self._readable_limit()
        if first < 0 or last < first:
            raise ValueError(f"bad entry range {first}..{last}")
        if last > limit:
            raise NoSuchEntry(f"ledger {self.id}: entry {last} is past the last readable "
                              f"entry {limit}")
        for entry_id in range(first, last + 1):
            yield self.read_entry(entry_id)

    def _readable_limit(self) -> int:
        metadata = self._metadata
        if metadata.state is LedgerState.CLOSED:
            return metadata.last_entry_id
        return self._lac

    def read_entry(self, entry_id: int, fence: bool = False) -> LedgerEntry:
        """One entry, from the first bookie of its write set that has a valid copy."""
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
        raise _read_error(self.id, entry_id, errors)

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
        """Ask the bookies of the last fragment for the LAC; the highest answer wins."""
        if self._metadata.state is LedgerState.CLOSED:
            return self._metadata.last_entry_id
        answers = []
        for bookie_id in self._metadata.fragments[-1].ensemble:
            future = self._bk.bookie_client(bookie_id).read_lac(self.id)
            try:
                answers.append(future.result(timeout=self._bk.settings.readTimeout))
            except (BookKeeperError, FutureTimeout):
                continue
        with self._lock:
            if answers and max(answers) > self._lac:
                self._lac = max(answers)
            return self._lac

    def read_last_add_confirmed_and_entry(self, timeout: float
                                          ) -> tuple[int, LedgerEntry | None]:
        """Long poll: wait up to ``timeout`` seconds for the LAC to move past the one
        known now; return the new LAC and that entry (or the old LAC and None)."""
        known = self._lac
        deadline = time.monotonic() + timeout
        pause = 0.0005
        while True:
            lac = self.read_last_add_confirmed()
            if lac > known:
                return lac, self.read_entry(lac)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._metadata.state is LedgerState.CLOSED:
                return lac, None
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 0.01)


def _read_error(ledger_id: int, entry_id: int, errors: list[BaseException]) -> BookKeeperError:
    """The error a reader gets once every bookie of the write set failed."""
    if any(isinstance(e, DigestMismatch) for e in errors):
        return DigestMismatch(f"ledger {ledger_id} entry {entry_id}: no copy with a valid "
                              f"digest ({len(errors)} bookies tried)")
    if errors and all(isinstance(e, (NoSuchEntry, NoSuchLedger)) for e in errors):
        return NoSuchEntry(f"ledger {ledger_id} has no entry {entry_id} on any bookie")
    return BookKeeperError(f"ledger {ledger_id} entry {entry_id}: every bookie failed: "
                           + "; ".join(str(e) for e in errors))


__all__ = ["LedgerHandle", "LedgerEntry"]
