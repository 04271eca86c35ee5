"""Fencing and recovery: how a reader takes a ledger from a writer that may be dead.

Exactly the procedure of docs/DESIGN.md, "Fencing and recovery":

1. CAS the metadata to IN_RECOVERY (already IN_RECOVERY: another recoverer is at work;
   go on as well; CLOSED: nothing to do).
2. Fence every bookie of the last fragment by reading its last entry with the fence flag
   (the bookie persists the fence before answering).  Fencing is complete when, for every
   write set of the ensemble, fewer than Qa of its bookies are still without a valid
   answer (an entry, NoSuchEntry and NoSuchLedger all count).  All replies in and coverage
   unmet: recovery fails.  The old writer can no longer reach Qa on any write set.
   EntryMaybeLost (a bookie whose disks are newer than the ledger: it fenced it, but
   cannot say what it held) counts too: the fence is what coverage is about, and the
   LAC it does not give can only make recovery start earlier.
3. Start at max(highest LAC answered, first entry of the last fragment - 1) + 1 and read
   forward, entry by entry, *with the fence flag* (so that the old writer cannot slip an
   entry in behind us).  One digest-valid copy means the entry is present; it is absent
   once (Qw - Qa) + 1 bookies of its write set said they do not have it (NoSuchEntry,
   NoSuchLedger; never EntryMaybeLost: a bookie wiped since it acknowledged the entry
   says that, and counting it could close the ledger below an acknowledged entry).
   Anything else is unknown and recovery fails (to be retried).
4. Re-write every present entry to its whole write set with the recovery flag (a fenced
   bookie accepts those), waiting for Qa acknowledgements.  The re-writes go through a
   ledger handle in recovery mode (:class:`~pybk.client.ledger.LedgerHandle`): a bookie
   that refuses them (an error, e.g. a read-only or full bookie's) or does not answer
   them is replaced as a writer would replace it, several at once if need be, in a new
   fragment from the first entry not yet re-written (replacing the last fragment in
   place if it starts there), kept in memory as BookKeeper's ``ReadOnlyLedgerHandle``
   keeps its ``newEnsemblesFromRecovery``.  Unlike a writer, recovery never chooses a
   bookie it replaced: when too few others are writable it fails at once with
   NotEnoughBookies as the cause, and the ledger stays IN_RECOVERY with its fragments.
5. CAS the metadata to CLOSED with the last present entry and the new fragments.  If
   another recoverer closed it first, adopt its result: all recoverers converge on one
   last entry.  If the fragments changed under recovery (the ledger is still IN_RECOVERY
   but someone else rewrote its ensembles), fail rather than overwrite them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from pybk.client.context import ClientContext
from pybk.client.digest import DecodedEntry, DigestManager
from pybk.client.ledger import LedgerHandle
from pybk.errors import (
    BadVersion,
    BookKeeperError,
    DigestMismatch,
    EntryMaybeLost,
    LedgerRecoveryError,
    NoSuchEntry,
    NoSuchLedger,
)
from pybk.meta.ledger_metadata import Fragment, LedgerState
from pybk.meta.ledgers import Versioned
from pybk.storage import LAST_ENTRY

log = logging.getLogger(__name__)

#: Answers that the bookie lacks an entry (its subclass EntryMaybeLost is caught first
#: where it must not count as one).
_NO_ENTRY = (NoSuchEntry, NoSuchLedger)


def recover(bk: ClientContext, versioned: Versioned, password: bytes) -> Versioned:
    """Fence and recover a ledger; returns its CLOSED metadata and version."""
    metadata, version = versioned
    while metadata.state is LedgerState.OPEN:
        try:
            in_recovery = dataclasses.replace(metadata, state=LedgerState.IN_RECOVERY)
            version = bk.ledger_manager.update(in_recovery, version)
            metadata = in_recovery
        except BadVersion:
            metadata, version = bk.ledger_manager.read(metadata.ledger_id)
    if metadata.state is LedgerState.CLOSED:
        return Versioned(metadata, version)
    return _Recovery(bk, Versioned(metadata, version), password).run()


class _Recovery:
    def __init__(self, bk: ClientContext, versioned: Versioned, password: bytes) -> None:
        self._bk = bk
        self._md, self._version = versioned
        self._password = password
        self._id = self._md.ledger_id
        self._digest = DigestManager(self._id, self._md.digest_type, password,
                                     self._md.mac_key_prefix)
        self._key = bk.master_key(password)
        self._timeout = bk.settings.readTimeout

    def run(self) -> Versioned:
        """Fence, re-replicate, close; the CLOSED metadata and its version."""
        highest_lac = self._fence_and_read_lac()
        first_of_last = self._md.fragments[-1].first_entry_id
        entry_id = max(highest_lac, first_of_last - 1) + 1
        last, length = entry_id - 1, 0
        reads = 1 if last >= 0 else 0  # entries read, for the metrics
        if last >= 0:
            confirmed = self._read_present(last)
            if confirmed is None:
                raise LedgerRecoveryError(f"ledger {self._id}: entry {last}, confirmed "
                                          "before, is on no bookie")
            length = confirmed.length
        writer = LedgerHandle(self._bk, Versioned(self._md, self._version), self._password,
                              writable=True, last_add_confirmed=last, recovery=True,
                              length=length)
        try:
            rewrites = []
            while True:
                found = self._read_present(entry_id)
                if found is None:
                    break
                rewrites.append(writer._recovery_add(found))
                last, length = entry_id, found.length
                entry_id += 1
            self._wait_rewritten(rewrites)
        finally:
            writer.close()
        if self._bk.metrics is not None:  # and forward: each re-written, then one past
            self._bk.metrics.recovered(reads + len(rewrites) + 1, len(rewrites))
        log.info("ledger %d recovered: last entry %d, %d bytes", self._id, last, length)
        return self._close(writer.metadata.fragments, last, length)

    def _wait_rewritten(self, rewrites: list[Future]) -> None:
        """Wait for the re-writes; each ends by itself (acknowledged, or failed once no
        bookie can replace a failed one), within one timeout per ensemble change."""
        limit = self._bk.settings.addEntryTimeout * (self._md.ensemble_size + 2)
        for rewrite in rewrites:
            try:
                rewrite.result(timeout=limit)
            except FutureTimeout:
                raise LedgerRecoveryError(f"ledger {self._id}: re-writing entries did not "
                                          f"finish within {limit:.0f} s") from None
            except BookKeeperError as e:
                raise LedgerRecoveryError(f"ledger {self._id}: re-writing entries failed: "
                                          f"{e}") from e

    # step 2
    def _fence_and_read_lac(self) -> int:
        ensemble = self._md.fragments[-1].ensemble
        futures = {b: self._bk.bookie_client(b).read(self._id, LAST_ENTRY, True, self._key)
                   for b in ensemble}
        answered: set[str] = set()
        highest = -1
        deadline = time.monotonic() + self._timeout
        for bookie_id, future in futures.items():
            try:
                data = future.result(timeout=max(0.0, deadline - time.monotonic()))
                entry = self._digest.decode(_entry_id_of(data), data)
            except _NO_ENTRY:
                answered.add(bookie_id)
                continue
            except (BookKeeperError, FutureTimeout) as e:
                log.warning("ledger %d: fencing bookie %s failed: %s", self._id, bookie_id, e)
                continue
            answered.add(bookie_id)
            highest = max(highest, entry.last_add_confirmed)
        if not self._covered(ensemble, answered):
            raise LedgerRecoveryError(
                f"ledger {self._id}: could not fence enough bookies (answers from "
                f"{sorted(answered)} of {list(ensemble)}; every write set needs fewer than "
                f"Qa={self._md.ack_quorum_size} without an answer)")
        return highest

    def _covered(self, ensemble: tuple[str, ...], answered: set[str]) -> bool:
        e, qw, qa = len(ensemble), self._md.write_quorum_size, self._md.ack_quorum_size
        for start in range(e):
            write_set = [ensemble[(start + i) % e] for i in range(qw)]
            if sum(b not in answered for b in write_set) >= qa:
                return False
        return True

    # step 3
    def _read_present(self, entry_id: int) -> DecodedEntry | None:
        """The entry if present, None if absent; raises if it cannot be decided."""
        write_set = self._md.write_set(entry_id)
        futures = [(b, self._bk.bookie_client(b).read(self._id, entry_id, True, self._key))
                   for b in write_set]
        absent_needed = self._md.write_quorum_size - self._md.ack_quorum_size + 1
        absent = 0
        errors: list[BaseException] = []
        deadline = time.monotonic() + self._timeout
        for bookie_id, future in futures:
            try:
                data = future.result(timeout=max(0.0, deadline - time.monotonic()))
                return self._digest.decode(entry_id, data)
            except EntryMaybeLost as e:  # no answer: it may have lost the entry
                errors.append(e)
            except _NO_ENTRY:
                absent += 1
            except DigestMismatch as e:
                log.warning("ledger %d entry %d: bad copy on %s: %s", self._id, entry_id,
                            bookie_id, e)
                errors.append(e)
            except (BookKeeperError, FutureTimeout) as e:
                errors.append(e)
        if absent >= absent_needed:
            return None
        raise LedgerRecoveryError(
            f"ledger {self._id}: cannot tell whether entry {entry_id} exists ({absent} of "
            f"{len(write_set)} bookies said no, {absent_needed} needed; errors: {errors})")

    # step 5
    def _close(self, fragments: tuple[Fragment, ...], last_entry: int,
               length: int) -> Versioned:
        metadata, version = self._md, self._version
        while True:
            closed = dataclasses.replace(metadata, state=LedgerState.CLOSED, fragments=fragments,
                                         last_entry_id=last_entry, length=length)
            try:
                return Versioned(closed, self._bk.ledger_manager.update(closed, version))
            except BadVersion:
                metadata, version = self._bk.ledger_manager.read(self._id)
            if metadata.state is LedgerState.CLOSED:
                if metadata.last_entry_id != last_entry:
                    log.info("ledger %d: another recoverer closed it at entry %d (we found "
                             "%d); adopting its result", self._id, metadata.last_entry_id,
                             last_entry)
                return Versioned(metadata, version)
            if metadata.state is not LedgerState.IN_RECOVERY \
                    or metadata.fragments != self._md.fragments:
                raise LedgerRecoveryError(
                    f"ledger {self._id} changed while it was being recovered (now "
                    f"{metadata.state.value} with fragments {list(metadata.fragments)}); "
                    "recover it again")


def _entry_id_of(data: bytes) -> int:
    return int.from_bytes(data[8:16], "big") if len(data) >= 16 else -1
