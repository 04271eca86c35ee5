"""The replication worker: claims the ledgers the auditor marks and repairs them.

BookKeeper's ``ReplicationWorker``.  One runs in every process that takes part in
autorecovery (:mod:`pybk.autorecovery.service`), on its own thread,
``pybk-replication-worker``, one ledger at a time:

Claiming
    While re-replication is enabled (no ``underreplication/disable``), the worker
    claims a marked ledger no other worker holds
    (:meth:`~pybk.meta.underreplication.UnderreplicationManager.claim_next`: an
    ephemeral lock, so several workers share the marks without doing a ledger twice,
    and a dead worker's claims end with its session).  It waits for marks to be
    announced when there is none to claim, looking again every :data:`POLL_S` (a claim
    that ended with a dead worker's session is announced by nothing).

Repairing
    :class:`~pybk.autorecovery.rereplication.LedgerRepair` copies the entries of the ledger's
    lost replicas to replacements and records them in its metadata.  Then the mark is
    cleared at the version claimed: a ledger marked again meanwhile (another bookie
    lost) stays marked and is repaired again.  A deleted ledger's mark is simply
    cleared.

Waiting, with the claim held
    * An OPEN ledger whose last fragment lost a bookie: the worker waits
      ``openLedgerRereplicationGracePeriod`` for its writer to replace the bookie
      (watching its metadata: the writer's ensemble change ends the wait), then fences
      and closes it (recovery) and repairs it.
    * A ledger that cannot be repaired yet (no readable copy, too few bookies for a
      replacement, a copy that failed) is tried again later, with exponential back-off:
      ``lockReleaseOfFailedLedgerGracePeriod`` / 32 after the first failure, twice as
      long after each next, at most ``lockReleaseOfFailedLedgerGracePeriod``.  It stays
      marked meanwhile.  A bookie joining the cluster ends these waits at once (it may
      be the replacement that was lacking).
    Other marked ledgers are repaired meanwhile.  Disabling re-replication releases
    the claims held (the marks stay) until it is enabled again.

Failures of the metadata store (ZooKeeper unavailable) are logged and the step is tried
again after :data:`RETRY_S`; a ledger whose mark could not be cleared is tried again
like one that could not be repaired (finding nothing left to copy), and a claim whose
release failed is released again before anything else (a claim standing in a live
session would keep every worker off its ledger).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

from pybk.autorecovery.rereplication import LedgerRepair, Outcome, Stopped
from pybk.client.bookkeeper import BookKeeper
from pybk.errors import BookKeeperError
from pybk.meta import paths
from pybk.meta.interface import MetadataStore
from pybk.meta.underreplication import Claim, UnderreplicationManager
from pybk.meta.watches import Watch
from pybk.settings import ServerSettings

log = logging.getLogger(__name__)

#: Seconds between looks for claimable marks when none is announced.
POLL_S = 10.0
#: Seconds before a step that failed on the metadata store is tried again.
RETRY_S = 1.0
#: Failures after which the back-off of a ledger stops doubling (BookKeeper's
#: ``NUM_OF_EXPONENTIAL_BACKOFF_RETRIALS``).
BACKOFF_DOUBLINGS = 5
#: How long :meth:`ReplicationWorker.close` waits by default for the thread to end its
#: step.  A copy ends between two batches; a step in a store call lasts up to
#: ``zkOperationTimeoutMs`` while ZooKeeper is down, and a batch waits on its bookies up
#: to ``addEntryTimeout``: closing the store and the worker's client ends those sooner.
CLOSE_WAIT_S = 2.0


@dataclass
class WorkerStats:
    """What a worker did since it started."""

    ledgers_replicated: int = 0   #: ledgers repaired whose marks it cleared
    ledgers_deleted: int = 0      #: marks of deleted ledgers it cleared
    entries_copied: int = 0
    bytes_copied: int = 0         #: bytes of entries written to replacement bookies
    failures: int = 0             #: repairs that failed (and were deferred)
    passes: int = 0               #: times its loop looked at the work (tests wait on it)


@dataclass
class _Held:
    """A claim this worker holds while it waits to try the ledger again."""

    claim: Claim
    due: float                       #: monotonic time of the next attempt
    failures: int = 0
    writer_wait_since: float | None = None  #: when its writer's grace period began
    watch: Watch | None = None  #: on its metadata, while its writer has its grace period


class ReplicationWorker:
    """Repairs the marked ledgers of the cluster in ``store`` through the client ``bk``
    (not closed here), claiming them as ``manager``'s owner.  Runs from :meth:`start`
    until :meth:`close`."""

    def __init__(self, store: MetadataStore, manager: UnderreplicationManager,
                 settings: ServerSettings, bk: BookKeeper) -> None:
        self.store = store
        self.manager = manager
        self.settings = settings
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._repair = LedgerRepair(bk, settings, self._stop)
        self._ledgers = bk.ledger_manager
        self._wake = threading.Condition()
        self._poked = False
        self._bookies_changed = False
        self._ledgers_changed: set[int] = set()  # waiting for their writers, changed
        self._held: dict[int, _Held] = {}
        self._unreleased: list[Claim] = []  # claims whose release failed
        self._watches: list = []
        self._thread = threading.Thread(target=self._run, name="pybk-replication-worker",
                                        daemon=True)

    @property
    def name(self) -> str:
        return self.manager.owner

    def start(self) -> "ReplicationWorker":
        self._thread.start()
        return self

    def _poke(self, bookies: bool = False, ledger_id: int | None = None) -> None:
        with self._wake:
            self._poked = True
            self._bookies_changed |= bookies
            if ledger_id is not None:
                self._ledgers_changed.add(ledger_id)
            self._wake.notify_all()

    def wait_passes(self, passes: int, timeout_s: float) -> bool:
        """Wait until the worker's loop made ``passes`` passes (``stats.passes``)."""
        with self._wake:
            return self._wake.wait_for(lambda: self.stats.passes >= passes, timeout_s)

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        log.info("replication worker %s: repairing the cluster in %s", self.name, self.store)
        try:
            self._watches = [
                self.manager.watch_marks(self._poke),
                self.manager.watch_enabled(lambda _enabled: self._poke()),
                self.store.watch(paths.AVAILABLE, lambda _p: self._poke(bookies=True))]
        except BookKeeperError as e:
            log.error("replication worker %s: cannot watch the cluster (%s); not repairing",
                      self.name, e)
            return
        try:
            while not self._stop.is_set():
                with self._wake:
                    self._poked = False
                    bookies_changed, self._bookies_changed = self._bookies_changed, False
                    ledgers_changed, self._ledgers_changed = self._ledgers_changed, set()
                    self.stats.passes += 1
                    self._wake.notify_all()
                try:
                    wait_s = self._step(bookies_changed, ledgers_changed)
                except BookKeeperError as e:
                    log.warning("replication worker %s: %s; trying again in %.0f s",
                                self.name, e, RETRY_S)
                    wait_s = RETRY_S
                if wait_s > 0:
                    with self._wake:
                        if not self._poked and not self._stop.is_set():
                            self._wake.wait(wait_s)
        finally:
            self._release_all("closing")
            # Cancelled here, not by close(): a cancel may wait behind another thread
            # setting a watch on the same store while ZooKeeper is down.
            for watch in self._watches:
                watch.cancel()
            log.info("replication worker %s: stopped", self.name)

    def _step(self, bookies_changed: bool, ledgers_changed: set[int]) -> float:
        """Do one ledger, if one is due; how long to wait for the next (0: at once)."""
        unreleased, self._unreleased = self._unreleased, []
        for claim in unreleased:
            self._release(claim)
        if self._unreleased:
            return RETRY_S
        if not self.manager.is_enabled():
            self._release_all("re-replication is disabled")
            return POLL_S
        now = time.monotonic()
        if bookies_changed:
            for held in self._held.values():
                if held.failures:
                    held.due = now  # the bookie that joined may be the one lacking
        for ledger_id in ledgers_changed:
            if ledger_id in self._held:
                self._held[ledger_id].due = now  # its writer may have replaced the bookie
        due = min(self._held.values(), key=lambda h: h.due, default=None)
        if due is not None and due.due <= now:
            del self._held[due.claim.ledger_id]
            self._attempt(due)
            return 0
        claimed = self.manager.claim_next()
        if claimed is not None:
            self._attempt(_Held(claimed, now))
            return 0
        next_due = due.due - now if due is not None else math.inf
        return min(POLL_S, next_due)

    def _attempt(self, held: _Held) -> None:
        ledger_id = held.claim.ledger_id
        if held.watch is not None:
            held.watch.cancel()
            held.watch = None
        grace_s = self.settings.openLedgerRereplicationGracePeriod / 1000
        now = time.monotonic()
        grace_over = held.writer_wait_since is not None \
            and now >= held.writer_wait_since + grace_s
        try:
            result = self._repair.run(ledger_id, held.claim.mark.replicas, grace_over)
            cleared = result.outcome is not Outcome.WAIT_FOR_WRITER \
                and self.manager.mark_replicated(held.claim)
        except Stopped:
            self._release(held.claim)
            return
        except BookKeeperError as e:  # tried again later (what was recorded stays done)
            held.failures += 1
            self.stats.failures += 1
            cap_s = self.settings.lockReleaseOfFailedLedgerGracePeriod / 1000
            wait_s = min(cap_s, cap_s / 2 ** BACKOFF_DOUBLINGS * 2 ** (held.failures - 1))
            held.due = time.monotonic() + wait_s
            self._held[ledger_id] = held
            log.warning("replication worker %s: ledger %d cannot be re-replicated yet (%s); "
                        "trying again in %.1f s", self.name, ledger_id, e, wait_s)
            return
        if result.outcome is Outcome.WAIT_FOR_WRITER:
            if held.writer_wait_since is None:
                held.writer_wait_since = now
                log.info("replication worker %s: ledger %d is open and its last fragment "
                         "lost a bookie: giving its writer %.1f s to replace it", self.name,
                         ledger_id, grace_s)
            held.due = held.writer_wait_since + grace_s
            self._held[ledger_id] = held
            try:  # its writer's ensemble change ends the wait
                held.watch = self._ledgers.watch(
                    ledger_id, lambda changed: self._poke(ledger_id=changed))
            except BookKeeperError as e:
                log.info("replication worker %s: cannot watch ledger %d (%s); waiting out "
                         "its writer's grace period", self.name, ledger_id, e)
            return
        if result.outcome is Outcome.DELETED:
            self.stats.ledgers_deleted += 1
            log.info("replication worker %s: ledger %d was deleted: its mark is cleared",
                     self.name, ledger_id)
            return
        self.stats.ledgers_replicated += 1
        self.stats.entries_copied += result.entries
        self.stats.bytes_copied += result.bytes
        log.info("replication worker %s: ledger %d re-replicated (%d entries, %d bytes "
                 "copied)%s", self.name, ledger_id, result.entries, result.bytes,
                 "" if cleared else "; it was marked again meanwhile and stays marked")

    def _release(self, claim: Claim) -> None:
        """Give the claim up; if the store fails, try again at the next step (a claim
        left standing in a live session would keep every worker off the ledger)."""
        try:
            self.manager.release(claim)
        except BookKeeperError as e:
            log.info("replication worker %s: releasing ledger %d failed (%s); trying "
                     "again", self.name, claim.ledger_id, e)
            self._unreleased.append(claim)

    def _release_all(self, why: str) -> None:
        if self._held:
            log.info("replication worker %s: %s: releasing ledgers %s", self.name, why,
                     sorted(self._held))
        for held in self._held.values():
            if held.watch is not None:
                held.watch.cancel()
        claims = [held.claim for held in self._held.values()] + self._unreleased
        self._held.clear()
        self._unreleased = []
        for claim in claims:
            self._release(claim)

    # -- life cycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Tell the thread to stop (it gives up the ledger in progress between two
        batches of copies); does not wait."""
        self._stop.set()
        self._poke()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop repairing and release the claims held, waiting at most ``wait_s`` for
        the ledger in progress."""
        self.stop()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait_s)
            if self._thread.is_alive():
                log.warning("replication worker %s: its step still waits on the metadata "
                            "store or a bookie; it ends with that call", self.name)
