"""Re-replicating one ledger: copy what its lost replicas held, then record the copies.

BookKeeper's ``LedgerFragmentReplicator`` (``BookKeeperAdmin.replicateLedgerFragment``),
made exact.  For a marked ledger, :meth:`LedgerRepair.run`:

1. Reads the ledger's metadata.  A deleted ledger needs nothing (its mark is cleared).
2. An OPEN (or IN_RECOVERY) ledger whose last fragment names a bookie that is not
   registered is its writer's to repair: a live writer replaces that bookie itself on
   its next add (an ensemble change).  So the caller first waits
   ``openLedgerRereplicationGracePeriod`` (the result says so); after it, the ledger
   is fenced and closed (recovery, :func:`pybk.client.recovery.recover`, which
   re-writes its last entries to live bookies).  An open ledger whose last fragment is
   healthy is left open: only its fragments before the last, whose ends are known, are
   repaired.
3. Finds the *lost replicas* of every fragment with a known end: the bookies of its
   ensemble that hold some of its entries (:mod:`pybk.autorecovery.replicas`) and are not
   registered, and the registered bookies the mark names that lack entries of it (read
   as the auditor's ledger check does, :mod:`pybk.autorecovery.ledger_check`: a lost disk).
4. Chooses, per fragment, a replacement for each lost replica with the client's
   placement (:meth:`pybk.client.BookKeeper.choose_replacements`), never a bookie of the
   fragment's ensemble; a rack-aware placement keeps the fragment's write sets across
   racks (:mod:`pybk.client.rackaware`).
5. Copies exactly the entries the lost replica held: the entries of the fragment whose
   write set includes its position in the ensemble (``(index - e) mod E < Qw``), not
   the whole fragment (BookKeeper copies whole fragments when ``Qw < E``, and so
   over-replicates).  Each entry is read from a surviving replica of its write set (the
   next one after a failure), its digest checked with the ledger's password, and written
   to the replacement as a recovery add (a fenced ledger's bookie takes it).  Entries go
   in batches of ``rereplicationEntryBatchSize``, pipelined: a batch is asked of each
   source bookie in one batch read, several batches are read ahead while the oldest one
   is checked and written, and the adds go as grouped adds (one answer per reply of the
   replacement, no Future per add).  The read budgets in flight plus the bytes of the
   adds not yet acknowledged stay within ``rereplicationMaxBytesInFlight`` (one batch
   always goes); at most ``replicationRateByBytes`` bytes are written a second.
6. Records the replacement with a compare-and-set of the fragment's ensemble, only if
   the lost bookie is still at its place there (another worker, or the writer, may have
   moved on); a lost race re-reads the metadata and tries again.

Any failure (no surviving copy readable, too few bookies for a replacement, a write
that failed or was not acknowledged within ``addEntryTimeout``) raises a
:class:`~pybk.errors.BookKeeperError`: the ledger is not repaired yet, and what was
copied before is harmless (an entry written twice is the same bytes; the metadata names
the replacement only once every add of its copies was acknowledged durable, and adds
of a failed copy still in flight only write those same bytes again).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Collection, Iterator, NamedTuple, Sequence

from pybk.autorecovery.ledger_check import fragments_lacking_entries
from pybk.autorecovery.replicas import Span, first_held, holds, spans
from pybk.autorecovery.throttle import ByteRate
from pybk.client.digest import DigestManager
from pybk.client.reads import READ_BATCH_MAX_BYTES, read_error
from pybk.client.recovery import recover
from pybk.client.transport import LedgerAdds, failed_future
from pybk.errors import (
    BadVersion,
    BookKeeperError,
    DigestMismatch,
    MetadataError,
    NoSuchLedger,
    Timeout,
    Unauthorized,
)
from pybk.meta.ledger_metadata import Fragment, LedgerMetadata, LedgerState
from pybk.settings import ServerSettings

if TYPE_CHECKING:
    from pybk.client.bookkeeper import BookKeeper

log = logging.getLogger(__name__)

#: Compare-and-set attempts of one metadata update that keeps losing races.
_UPDATE_ATTEMPTS_MAX = 100


class Outcome(enum.Enum):
    REPLICATED = "replicated"          # every lost replica is replaced (or none was)
    DELETED = "deleted"                # the ledger is gone: nothing to repair
    WAIT_FOR_WRITER = "wait for writer"  # open, its last fragment lost a bookie


class Result(NamedTuple):
    outcome: Outcome
    entries: int = 0   #: entries copied
    bytes: int = 0     #: bytes of entries written to replacements


class Copy(NamedTuple):
    """One lost replica of a fragment, and what repairing it copies where."""

    first_entry: int              #: the fragment's first entry
    ensemble_index: int           #: the lost replica's place in the fragment's ensemble
    lost: str                     #: the lost bookie
    replacement: str              #: the bookie the entries go to
    entry_ids: tuple[int, ...]    #: exactly the entries the lost bookie held there


def writer_lost_bookies(metadata: LedgerMetadata, registered: set[str]) -> bool:
    """Whether the ledger is not closed and its last fragment names a bookie not in
    ``registered``: that fragment has no known end, so a repair fences and closes the
    ledger first (once its writer had its grace period)."""
    return metadata.state is not LedgerState.CLOSED and \
        not registered.issuperset(metadata.fragments[-1].ensemble)


class Stopped(BookKeeperError):
    """The repair was given up because its worker is closing."""


class _Plan(NamedTuple):
    """A batch's read requests, not sent yet: its entry ids by the bookie asked."""

    entry_ids: Sequence[int]
    by_bookie: dict[str, list[int]]
    sources: dict[int, tuple[str, ...]]  #: the sources by ``entry_id % E`` when planned

    @property
    def reserved(self) -> int:
        """The bytes its requests may bring: one READ_BATCH's budget per bookie."""
        return READ_BATCH_MAX_BYTES * len(self.by_bookie)

    def send(self, bk: "BookKeeper", ledger_id: int, timeout_s: float) -> "_BatchRead":
        requests = []
        for bookie_id, ids in self.by_bookie.items():
            try:
                read = bk.bookie_client(bookie_id).read_batch(ledger_id, ids,
                                                              READ_BATCH_MAX_BYTES)
            except BookKeeperError as e:
                read = failed_future(e)
            requests.append((bookie_id, ids, read))
        return _BatchRead(self.entry_ids, requests, self.sources, self.reserved,
                          time.monotonic() + timeout_s)


class _BatchRead(NamedTuple):
    """A batch's read requests in flight (one READ_BATCH per first source bookie)."""

    entry_ids: Sequence[int]
    requests: list[tuple[str, list[int], Future]]
    sources: dict[int, tuple[str, ...]]
    reserved: int
    deadline: float  #: monotonic time after which an unanswered request has failed

    def sources_of(self, entry_id: int) -> tuple[str, ...]:
        """The entry's sources in the order used when the batch was asked: the first
        was asked in the batch, the others are asked one by one if its answer for the
        entry is an error or a bad copy (an entry it did not answer: :meth:`_Sources.of`)."""
        return self.sources[entry_id % len(self.sources)]

    def answers(self, sources: "_Sources") -> dict[int, "bytes | BaseException"]:
        """Wait (until the deadline) for the answers, an entry's bytes or the error
        reading it, by entry id; a request that failed as a whole (an error, no answer
        in time) answers nothing, and its bookie is asked of last from then on."""
        answers: dict[int, bytes | BaseException] = {}
        for bookie_id, ids, read in self.requests:
            try:
                answers.update(zip(ids, read.result(max(0.0, self.deadline
                                                         - time.monotonic()))))
            except (BookKeeperError, FutureTimeout):
                sources.avoid(bookie_id)
        return answers


class _Sources:
    """Where the entries of one fragment are read from: each entry's write set on
    ``ensemble`` without the ``lost`` bookies, those that failed a batch read last."""

    def __init__(self, metadata: LedgerMetadata, ensemble: tuple[str, ...],
                 lost: set[str]) -> None:
        e, qw = metadata.ensemble_size, metadata.write_quorum_size
        self._write_sets = [tuple(b for b in (ensemble[(start + i) % e] for i in range(qw))
                                  if b not in lost) for start in range(e)]
        self._avoided: set[str] = set()
        self._by_start = dict(enumerate(self._write_sets))

    def avoid(self, bookie_id: str) -> None:
        if bookie_id not in self._avoided:
            self._avoided.add(bookie_id)
            avoided = self._avoided.__contains__
            self._by_start = {start: tuple(sorted(write_set, key=avoided))
                              for start, write_set in enumerate(self._write_sets)}

    def of(self, entry_id: int) -> tuple[str, ...]:
        """The entry's sources now, those that failed a batch read last."""
        return self._by_start[entry_id % len(self._by_start)]

    def plan(self, entry_ids: Sequence[int]) -> _Plan:
        """The batch of ``entry_ids``, each asked of its first source."""
        by_start = self._by_start
        e = len(by_start)
        by_bookie: dict[str, list[int]] = {}
        for entry_id in entry_ids:
            bookies = by_start[entry_id % e]
            if bookies:  # else every replica is lost: _read_verified says so
                ids = by_bookie.get(bookies[0])
                if ids is None:
                    by_bookie[bookies[0]] = [entry_id]
                else:
                    ids.append(entry_id)
        return _Plan(entry_ids, by_bookie, by_start)


class _Adds:
    """The recovery adds of one copy to its replacement ``target``, grouped: each is
    sent through the transport's grouped adds (:meth:`BookieClient.ledger_adds`, else
    :meth:`BookieClient.add_grouped`, never a Future per add), and each answer of the
    bookie (over ZeroMQ, one per ADD message) is taken in at once, under one lock.
    Keeps the bytes of the adds not acknowledged yet (:attr:`bytes`) and the first
    failure, which :meth:`check` and :meth:`wait_below` raise.  For one thread (answers
    come on the transport's)."""

    def __init__(self, bk: "BookKeeper", ledger_id: int, master_key: bytes, target: str,
                 timeout_s: float) -> None:
        self._bk = bk
        self._ledger_id = ledger_id
        self._key = master_key
        self._target = target
        self._timeout_s = timeout_s
        self._send: LedgerAdds | None = None
        # One sink object for every add: transports group the answers by its identity.
        self._sink = self._answered
        self._changed = threading.Condition(threading.Lock())
        self._sizes: dict[int, int] = {}  # entry id -> its bytes, until acknowledged
        self.bytes = 0  #: bytes of the adds sent and not acknowledged yet
        self._failure: BookKeeperError | None = None
        self._progress_at = time.monotonic()  # the last add sent or answer taken in

    def send(self, entry_ids: Sequence[int], entries: list[bytes], sizes: list[int]) -> None:
        """Send a batch's adds, as a group (one ADD message over ZeroMQ when the
        connection has room for it); ``sizes``: the entries' lengths."""
        with self._changed:
            self._sizes.update(zip(entry_ids, sizes))
            self.bytes += sum(sizes)
            self._progress_at = time.monotonic()
        last = len(entry_ids) - 1
        for index, (entry_id, entry) in enumerate(zip(entry_ids, entries)):
            self._send_one(entry_id, entry, index < last)

    def _send_one(self, entry_id: int, entry: bytes, more: bool) -> None:
        if self._send is not None and self._send(entry_id, entry, entry_id, more):
            return
        # No sender yet, or its connection went down: ask for the bookie's client again.
        client = self._bk.bookie_client(self._target)
        self._send = client.ledger_adds(self._ledger_id, self._key, self._sink,
                                        recovery=True)
        if self._send is None or not self._send(entry_id, entry, entry_id, more):
            self._send = None
            client.add_grouped(self._ledger_id, entry_id, entry, self._key, entry_id,
                               self._sink, recovery=True)

    def _answered(self, entry_ids: Sequence[int],
                  errors: Sequence[BaseException | None] | None) -> None:
        """The sink of the adds (the transport's thread)."""
        with self._changed:
            sizes = self._sizes
            for entry_id in entry_ids:
                self.bytes -= sizes.pop(entry_id, 0)
            if errors is not None and self._failure is None:
                for entry_id, error in zip(entry_ids, errors):
                    if error is not None:
                        self._failure = BookKeeperError(
                            f"ledger {self._ledger_id}: bookie {self._target} did not "
                            f"store entry {entry_id}: {error}")
                        break
            self._progress_at = time.monotonic()
            self._changed.notify_all()

    def check(self) -> None:
        """Raise the first failure of an add, if one failed."""
        if self._failure is not None:
            raise self._failure

    def wait_below(self, limit: int) -> None:
        """Wait until the adds not acknowledged hold at most ``limit`` bytes (0: every
        add is acknowledged); raise the first failure, or Timeout once no add was sent
        or answered for ``addEntryTimeout``."""
        with self._changed:
            while True:
                self.check()
                if self.bytes <= limit and (limit or not self._sizes):
                    return
                left = self._progress_at + self._timeout_s - time.monotonic()
                if left <= 0:
                    raise Timeout(f"ledger {self._ledger_id}: bookie {self._target} "
                                  f"answered no add for {self._timeout_s} s; "
                                  f"{len(self._sizes)} adds not acknowledged (entries "
                                  f"{sorted(self._sizes)[:10]}"
                                  f"{'...' if len(self._sizes) > 10 else ''})")
                self._changed.wait(left)


class LedgerRepair:
    """Repairs ledgers through the client ``bk`` (whose bookies, placement and metadata
    it uses), opening them with ``settings.bookieRecoveryPasswd``.  ``stop`` ends a
    repair between two batches of copies.  For one thread."""

    def __init__(self, bk: "BookKeeper", settings: ServerSettings,
                 stop: threading.Event) -> None:
        self._bk = bk
        self._settings = settings
        self._password = settings.bookieRecoveryPasswd.encode("utf-8")
        self._key = bk.master_key(self._password)
        self._stop = stop
        self._rate = ByteRate(settings.replicationRateByBytes, stop)

    def run(self, ledger_id: int, marked: Collection[str], writer_grace_over: bool) -> Result:
        """Repair the ledger (see the module docstring); ``marked`` are the replicas its
        mark names, ``writer_grace_over`` whether an open ledger's writer had its grace
        period."""
        try:
            versioned = self._bk.ledger_manager.read(ledger_id)
        except NoSuchLedger:
            return Result(Outcome.DELETED)
        metadata = versioned.metadata
        if not metadata.check_password(self._password):
            raise Unauthorized(f"ledger {ledger_id} was created with another password than "
                               "bookieRecoveryPasswd: replication workers cannot open it")
        registered = set(self._bk.metadata.bookies())
        if writer_lost_bookies(metadata, registered):
            if not writer_grace_over:
                return Result(Outcome.WAIT_FOR_WRITER)
            log.warning("ledger %d: its writer did not replace the lost bookies of its last "
                        "fragment %s: fencing and closing it", ledger_id,
                        list(metadata.fragments[-1].ensemble))
            try:
                metadata = recover(self._bk, versioned, self._password).metadata
            except NoSuchLedger:
                return Result(Outcome.DELETED)
            registered = set(self._bk.metadata.bookies())
        entries = written = 0
        for span, copies in self._planned(metadata, registered, marked):
            copied, size = self._repair_fragment(metadata, span, copies)
            entries += copied
            written += size
        return Result(Outcome.REPLICATED, entries, written)

    def plan(self, metadata: LedgerMetadata, marked: Collection[str]) -> list[Copy]:
        """What :meth:`run` would copy for the ledger as ``metadata`` stands, changing
        nothing: one :class:`Copy` per lost replica of a fragment with a known end, with
        the replacement placement chooses now (a later run may choose another).  An open
        ledger's last fragment is not planned: see :func:`writer_lost_bookies`."""
        registered = set(self._bk.metadata.bookies())
        return [copy for _span, copies in self._planned(metadata, registered, marked)
                for copy in copies]

    def _planned(self, metadata: LedgerMetadata, registered: set[str],
                 marked: Collection[str]) -> Iterator[tuple[Span, list[Copy]]]:
        """The fragments that lost replicas, each with its copies; replacements are
        chosen fragment by fragment, as the caller comes to it (a long repair sees the
        bookies as they are then)."""
        for span, lost in self._lost_replicas(metadata, registered, marked):
            replacements = self._bk.choose_replacements(
                metadata.ledger_id, span.ensemble, sorted(lost), metadata.write_quorum_size)
            yield span, [
                Copy(span.first, index, lost[index], target,
                     tuple(e for e in range(span.first, span.last + 1)  # type: ignore[operator]
                           if holds(metadata, index, e)))
                for index, target in zip(sorted(lost), replacements)]

    # -- what is lost -------------------------------------------------------------------

    def _lost_replicas(self, metadata: LedgerMetadata, registered: set[str],
                       marked: Collection[str]) -> list[tuple[Span, dict[int, str]]]:
        """The fragments with a known end that lost replicas, each with the lost ones by
        ensemble index."""
        lacking = fragments_lacking_entries(
            metadata, registered.intersection(marked), self._bk.bookie_client,
            self._settings.auditorLedgerVerificationPercentage, self._bk.settings.readTimeout)
        found = []
        for span in spans(metadata):
            if span.last is None:
                continue  # an open ledger's last fragment: its writer's
            lost = {index: bookie_id for index, bookie_id in enumerate(span.ensemble)
                    if (bookie_id not in registered or (span.first, bookie_id) in lacking)
                    and first_held(metadata, index, span) is not None}
            if lost:
                found.append((span, lost))
        return found

    # -- copying ------------------------------------------------------------------------

    def _repair_fragment(self, metadata: LedgerMetadata, span: Span,
                         copies: list[Copy]) -> tuple[int, int]:
        """Replace the lost replicas of ``span``: copy, then record.  Returns the
        entries copied and their bytes."""
        ledger_id = metadata.ledger_id
        lost = {copy.lost for copy in copies}
        entries = written = 0
        for copy in copies:
            written += self._copy(metadata, span, copy.entry_ids, lost, copy.replacement)
            entries += len(copy.entry_ids)
            log.info("ledger %d: copied %d entries of bookie %s in the fragment from entry "
                     "%d to bookie %s", ledger_id, len(copy.entry_ids), copy.lost,
                     span.first, copy.replacement)
        self._record(ledger_id, span.first,
                     {copy.ensemble_index: (copy.lost, copy.replacement) for copy in copies})
        return entries, written

    def _copy(self, metadata: LedgerMetadata, span: Span, entry_ids: Sequence[int],
              lost: set[str], target: str) -> int:
        """Copy ``entry_ids`` (of ``span``) from their surviving replicas (not ``lost``)
        to ``target``; the bytes written.  Returns only once every add is acknowledged
        durable; raises (BookKeeperError) on the first failure of any of them.

        A pipeline: batches are asked of their sources ahead (:class:`_BatchRead`) while
        ``rereplicationMaxBytesInFlight`` allows, counting each request in flight at its
        byte budget and each add not yet acknowledged at its size; the oldest batch is
        checked and written (grouped adds, :class:`_Adds`) while the later ones are read."""
        ledger_id = metadata.ledger_id
        digest = DigestManager(ledger_id, metadata.digest_type, self._password,
                               metadata.mac_key_prefix)
        size = self._settings.rereplicationEntryBatchSize
        bound = self._settings.rereplicationMaxBytesInFlight
        sources = _Sources(metadata, span.ensemble, lost)
        adds = _Adds(self._bk, ledger_id, self._key, target, self._bk.settings.addEntryTimeout)
        plans = (sources.plan(entry_ids[start:start + size])
                 for start in range(0, len(entry_ids), size))
        plan = next(plans, None)
        reading: collections.deque[_BatchRead] = collections.deque()
        reserved = 0  # the read budgets of the batches in ``reading``
        written = 0
        while True:
            while plan is not None:  # read ahead while the bound allows
                if reserved + adds.bytes + plan.reserved > bound \
                        and (reading or adds.bytes):  # one batch always fits
                    break
                reading.append(plan.send(self._bk, ledger_id, self._bk.settings.readTimeout))
                reserved += plan.reserved
                plan = next(plans, None)
            if not reading:
                if plan is None:
                    break
                adds.wait_below(max(0, bound - plan.reserved))  # room for the next batch
                continue
            if self._stop.is_set():
                raise Stopped(f"ledger {ledger_id}: the replication worker is closing")
            batch = reading.popleft()
            answers = batch.answers(sources)
            # An entry its batch read did not answer is asked in the order of now, which
            # puts a bookie whose batch read failed last (a hung bookie would otherwise
            # cost readTimeout for each of them, one after the other).
            entries = [self._read_verified(digest, entry_id, batch.sources_of(entry_id),
                                           answers[entry_id]) if entry_id in answers
                       else self._read_verified(digest, entry_id, sources.of(entry_id), None)
                       for entry_id in batch.entry_ids]
            sizes = list(map(len, entries))
            self._rate.take(sum(sizes))
            adds.send(batch.entry_ids, entries, sizes)
            written += sum(sizes)
            reserved -= batch.reserved
            adds.check()
        adds.wait_below(0)
        return written

    def _read_verified(self, digest: DigestManager, entry_id: int, sources: Sequence[str],
                       first: "bytes | BaseException | None") -> bytes:
        """The entry as stored, from the first of ``sources`` with a copy whose digest
        is valid (``first``: what ``sources[0]`` answered already, if it did)."""
        errors: list[BaseException] = []
        for index, bookie_id in enumerate(sources):
            try:
                if index == 0 and first is not None:
                    if isinstance(first, BaseException):
                        raise first
                    data = first
                else:
                    data = self._bk.bookie_client(bookie_id).read(
                        digest.ledger_id, entry_id).result(timeout=self._bk.settings.readTimeout)
                digest.decode(entry_id, data)
                return data
            except DigestMismatch as e:
                log.warning("ledger %d entry %d: bad copy on %s: %s", digest.ledger_id,
                            entry_id, bookie_id, e)
                errors.append(e)
            except FutureTimeout:
                errors.append(Timeout(f"bookie {bookie_id} did not answer within "
                                      f"{self._bk.settings.readTimeout} s"))
            except BookKeeperError as e:
                errors.append(e)
        if not sources:
            raise BookKeeperError(f"ledger {digest.ledger_id} entry {entry_id}: every "
                                  "replica is lost")
        raise read_error(digest.ledger_id, entry_id, errors)

    # -- recording ----------------------------------------------------------------------

    def _record(self, ledger_id: int, first_entry_id: int,
                replaced: dict[int, tuple[str, str]]) -> None:
        """Put each replacement at its index in the fragment from ``first_entry_id``,
        where the lost bookie still is; ``replaced``: index -> (lost, replacement)."""
        for _ in range(_UPDATE_ATTEMPTS_MAX):
            try:
                metadata, version = self._bk.ledger_manager.read(ledger_id)
            except NoSuchLedger:
                return  # deleted meanwhile: nothing to record
            position = next((i for i, f in enumerate(metadata.fragments)
                             if f.first_entry_id == first_entry_id), None)
            if position is None:
                log.info("ledger %d: its fragment from entry %d is gone; not recorded",
                         ledger_id, first_entry_id)
                return
            ensemble = list(metadata.fragments[position].ensemble)
            applied = {i: new for i, (old, new) in replaced.items() if ensemble[i] == old}
            taken = sorted(new for new in applied.values() if new in ensemble)
            if taken:  # the copies count for nothing there: the ledger is tried again
                raise BookKeeperError(f"ledger {ledger_id}: bookies {taken} joined the "
                                      f"fragment from entry {first_entry_id} meanwhile; "
                                      "its lost replicas get other replacements")
            if not applied:
                log.info("ledger %d: the fragment from entry %d no longer names the lost "
                         "bookies; not recorded", ledger_id, first_entry_id)
                return
            for i, new in applied.items():
                ensemble[i] = new
            fragments = list(metadata.fragments)
            fragments[position] = Fragment(first_entry_id, tuple(ensemble))
            try:
                self._bk.ledger_manager.update(
                    dataclasses.replace(metadata, fragments=tuple(fragments)), version)
            except BadVersion:
                continue  # changed meanwhile (its writer, another worker): read it again
            except NoSuchLedger:
                return
            return
        raise MetadataError(f"ledger {ledger_id}: its metadata changed under "
                            f"{_UPDATE_ATTEMPTS_MAX} updates in a row")
