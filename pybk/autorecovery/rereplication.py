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
   in batches of ``rereplicationEntryBatchSize``: a batch is asked of each source bookie
   in one batch read, and read while the batch before is being written (so at most two
   batches are held); at most ``replicationRateByBytes`` bytes are written a second.
6. Records the replacement with a compare-and-set of the fragment's ensemble, only if
   the lost bookie is still at its place there (another worker, or the writer, may have
   moved on); a lost race re-reads the metadata and tries again.

Any failure (no surviving copy readable, too few bookies for a replacement, a write
that failed) raises a :class:`~pybk.errors.BookKeeperError`: the ledger is not repaired
yet, and what was copied before is harmless (an entry written twice is the same
bytes; the metadata names the replacement only once its copies are durable).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Collection, Iterator, NamedTuple

from pybk.autorecovery.ledger_check import fragments_lacking_entries
from pybk.autorecovery.replicas import Span, first_held, holds, spans
from pybk.autorecovery.throttle import ByteRate
from pybk.client.digest import DigestManager
from pybk.client.reads import READ_BATCH_MAX_BYTES, read_error
from pybk.client.recovery import recover
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
            written += self._copy(metadata, list(copy.entry_ids), lost, copy.replacement)
            entries += len(copy.entry_ids)
            log.info("ledger %d: copied %d entries of bookie %s in the fragment from entry "
                     "%d to bookie %s", ledger_id, len(copy.entry_ids), copy.lost,
                     span.first, copy.replacement)
        self._record(ledger_id, span.first,
                     {copy.ensemble_index: (copy.lost, copy.replacement) for copy in copies})
        return entries, written

    def _copy(self, metadata: LedgerMetadata, entry_ids: list[int], lost: set[str],
              target: str) -> int:
        """Copy ``entry_ids`` from their surviving replicas (not ``lost``) to ``target``;
        the bytes written.  A batch is read while the writes of the one before are in
        flight (so at most two batches' writes are)."""
        ledger_id = metadata.ledger_id
        digest = DigestManager(ledger_id, metadata.digest_type, self._password,
                               metadata.mac_key_prefix)
        batch = self._settings.rereplicationEntryBatchSize
        written = 0
        in_flight: list[tuple[int, Future]] = []
        for start in range(0, len(entry_ids), batch):
            if self._stop.is_set():
                raise Stopped(f"ledger {ledger_id}: the replication worker is closing")
            chunk = entry_ids[start:start + batch]
            sources = {e: [b for b in metadata.write_set(e) if b not in lost] for e in chunk}
            first_answers = self._read_batches(ledger_id, sources)
            adds: list[tuple[int, Future]] = []
            for entry_id in chunk:
                data = self._read_verified(digest, entry_id, sources[entry_id],
                                           first_answers.get(entry_id))
                self._rate.take(len(data))
                adds.append((entry_id, self._bk.bookie_client(target).add(
                    ledger_id, entry_id, data, self._key, recovery=True)))
                written += len(data)
            self._wait_written(ledger_id, target, in_flight)
            in_flight = adds
        self._wait_written(ledger_id, target, in_flight)
        return written

    def _wait_written(self, ledger_id: int, target: str,
                      adds: list[tuple[int, Future]]) -> None:
        for entry_id, add in adds:
            try:
                add.result(timeout=self._bk.settings.addEntryTimeout)
            except FutureTimeout:
                raise Timeout(f"ledger {ledger_id}: bookie {target} did not store entry "
                              f"{entry_id} within {self._bk.settings.addEntryTimeout} "
                              "s") from None

    def _read_batches(self, ledger_id: int, sources: dict[int, list[str]]
                      ) -> dict[int, "bytes | BaseException"]:
        """Ask each entry's first source for it, one batch read per bookie; the answers
        that came (an entry's bytes or the error reading it), by entry id."""
        by_bookie: dict[str, list[int]] = {}
        for entry_id, bookies in sources.items():
            if bookies:
                by_bookie.setdefault(bookies[0], []).append(entry_id)
        reads = [(ids, self._bk.bookie_client(bookie_id).read_batch(
            ledger_id, ids, READ_BATCH_MAX_BYTES)) for bookie_id, ids in by_bookie.items()]
        answers: dict[int, bytes | BaseException] = {}
        deadline = time.monotonic() + self._bk.settings.readTimeout
        for ids, read in reads:
            try:
                answers.update(zip(ids, read.result(max(0.0, deadline - time.monotonic()))))
            except (BookKeeperError, FutureTimeout):
                continue  # each of them is read again on its own
        return answers

    def _read_verified(self, digest: DigestManager, entry_id: int, sources: list[str],
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
