"""The auditor: finds lost replicas and marks their ledgers under-replicated.

One auditor runs in a cluster at a time (:mod:`pybk.autorecovery.election` elects it); the
replication workers repair what it marks (:mod:`pybk.meta.underreplication` holds the
marks).  Everything it does runs on its own thread, ``pybk-auditor``, one step at a
time:

Lost bookies (BookKeeper's ``Auditor``)
    It watches the bookie registry; writable and read-only bookies are both alive.  A
    bookie that leaves the registry is *missing* from then on.  A missing bookie is
    *lost*, and audited, once it has been missing for the cluster's
    ``lostBookieRecoveryDelay`` seconds (:class:`~pybk.meta.underreplication.
    UnderreplicationManager` keeps it; the first auditor writes its own setting there),
    or at once when the delay is 0 or when two or more bookies are missing together
    (several failures at once are urgent).  One bookie that is back before its delay is
    over causes nothing, so a rolling restart marks nothing.  A new delay counts from
    when it is set; setting it to 0, or writing it again unchanged (``pybk
    triggeraudit``, :meth:`~pybk.meta.underreplication.UnderreplicationManager.
    trigger_audit`), runs a bookie check and audits every missing bookie at once.
    Auditing lost bookies reads every ledger's metadata and marks each ledger that has
    an entry on one of them (:func:`pybk.autorecovery.replicas.bookie_holds_entries`: a
    bookie of a fragment that was given none of its entries costs nothing), naming the
    lost bookies it holds.

Bookie check (``auditorPeriodicBookieCheckInterval``, and once when elected)
    Bookies that hold entries of some ledger but are not registered are missing too,
    from the check on: this finds the bookies that died while no auditor ran (before it
    was elected, or between two auditors), which no registry change will ever announce;
    their cookies (``/ledgers/cookies``) say they were members, and the log says when
    one has none left.

Ledger check (``auditorPeriodicCheckInterval``)
    Reads what each fragment's live bookies hold (:mod:`pybk.autorecovery.ledger_check`) and
    marks the ledgers whose entries a live bookie lacks (a lost disk, a bookie
    re-formatted under its old id), naming that bookie.

The disable flag
    While ``underreplication/disable`` exists nothing is marked: missing bookies stay
    missing (and a bookie that comes back meanwhile is forgotten), and are audited once
    re-replication is enabled again.

The backlog (pybk's; BookKeeper reports only what each audit marked)
    After each audit, and every ``auditorBacklogIntervalSeconds``, it measures the
    repair work left and publishes it (:class:`~pybk.meta.underreplication.Backlog`):
    the ledgers marked now, how many of the cluster's acknowledged entries lack a
    replica (on a bookie that is marked missing in their ledger's mark, or that is not
    registered), and the fewest live replicas any acknowledged entry has.  An open
    ledger's entries are counted up to the highest LAC its live bookies report.

Memory
    Every step that looks at all ledgers walks them one at a time, as BookKeeper's
    auditor does: ids a page at a time, then each ledger's metadata read when its turn
    comes and let go after it.  So a step holds one ledger's metadata, one page of ids,
    and what it keeps across ledgers: bookie ids (lost, missing, holding entries),
    counters, and, for the backlog, the marks of the ledgers under-replicated now; never
    something for every ledger of the cluster.

Failures
    A step that fails on the metadata store (ZooKeeper unavailable) is logged and tried
    again after :data:`RETRY_S`; what is missing stays missing meanwhile.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable, Iterator

from pybk.autorecovery.ledger_check import bookies_lacking_entries
from pybk.autorecovery.replicas import bookie_holds_entries, coverage, spans
from pybk.client.transport import BookieClient
from pybk.errors import BookKeeperError
from pybk.meta import paths
from pybk.meta.interface import MetadataStore
from pybk.meta.ledger_metadata import LedgerMetadata, LedgerState
from pybk.meta.ledgers import LedgerManager
from pybk.meta.underreplication import Backlog, UnderreplicationManager
from pybk.settings import ServerSettings

log = logging.getLogger(__name__)

#: Seconds before a step that failed is tried again.
RETRY_S = 1.0
#: Seconds the auditor waits for one bookie's answer (a ledger check read, a LAC).
READ_TIMEOUT_S = 5.0
#: How long :meth:`Auditor.close` waits for the auditor's thread to end its step.  A
#: step may be in a store call that lasts up to ``zkOperationTimeoutMs`` while ZooKeeper
#: is down; the thread then ends when that call does, marking nothing more.
CLOSE_WAIT_S = 2.0


class Auditor:
    """The auditor of the cluster in ``store`` (see the module docstring), named
    ``auditor_id`` in what it publishes; ``client_for(bookie id)`` reaches a bookie.
    Runs from :meth:`start` until :meth:`close`."""

    def __init__(self, store: MetadataStore, manager: UnderreplicationManager,
                 settings: ServerSettings, client_for: Callable[[str], BookieClient],
                 auditor_id: str) -> None:
        self.store = store
        self.manager = manager
        self.settings = settings
        self.auditor_id = auditor_id
        self._client_for = client_for
        self._ledgers = LedgerManager(store)
        self._wake = threading.Condition()
        self._stop = False
        self._registry_changed = True
        self._known: set[str] = set()           # registered at the last look
        #: The backlog this auditor last published (None before its first), for metrics.
        self.last_backlog: Backlog | None = None
        self._missing: dict[str, float] = {}    # bookie id -> monotonic time missing since
        self._delay_s = settings.lostBookieRecoveryDelay
        self._delay_version: int | None = None  # of the delay's record, when last read
        self._enabled = True
        self._watches: list = []
        self._thread = threading.Thread(target=self._run, name="pybk-auditor", daemon=True)

    def start(self) -> "Auditor":
        self._thread.start()
        return self

    def _poke(self, registry: bool = False) -> None:
        with self._wake:
            self._registry_changed |= registry
            self._wake.notify_all()

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        log.info("auditor %s: auditing the cluster in %s", self.auditor_id, self.store)
        try:
            self._watches = [
                self.store.watch(paths.AVAILABLE, lambda _p: self._poke(registry=True)),
                self.store.watch(paths.READONLY, lambda _p: self._poke(registry=True)),
                self.manager.watch_enabled(lambda _enabled: self._poke()),
                self.manager.watch_lost_bookie_recovery_delay(self._poke)]
        except BookKeeperError as e:
            log.error("auditor %s: cannot watch the cluster (%s); not auditing",
                      self.auditor_id, e)
            return
        now = time.monotonic()
        bookie_check_s = self.settings.auditorPeriodicBookieCheckInterval
        ledger_check_s = self.settings.auditorPeriodicCheckInterval
        backlog_s = self.settings.auditorBacklogIntervalSeconds
        due = {"setup": now, "bookie check": now,
               "ledger check": now + ledger_check_s if ledger_check_s else math.inf,
               "backlog": now}
        steps: dict[str, Callable[[], None]] = {
            "setup": self._set_up, "bookie check": self._bookie_check,
            "ledger check": self._ledger_check, "backlog": self._publish_backlog}
        intervals = {"setup": 0, "bookie check": bookie_check_s,
                     "ledger check": ledger_check_s, "backlog": backlog_s}
        while True:
            with self._wake:
                if self._stop:
                    return
                registry_changed, self._registry_changed = self._registry_changed, False
            now = time.monotonic()
            try:
                if "setup" not in due:
                    trigger = self._read_delay()
                    if trigger:
                        self._bookie_check()
                    self._enabled = self.manager.is_enabled()
                    if registry_changed:
                        self._look_at_registry()
                    if self._enabled and self._audit_lost_bookies(now, trigger):
                        due["backlog"] = now
                for name in [name for name, at in due.items() if at <= now]:
                    steps[name]()
                    if name == "setup":
                        del due[name]
                        continue
                    due[name] = now + intervals[name] if intervals[name] else math.inf
                    if name != "backlog":
                        due["backlog"] = now  # measure what the check changed
            except _Closing:
                return
            except BookKeeperError as e:
                log.warning("auditor %s: %s; trying again in %.0f s", self.auditor_id, e,
                            RETRY_S)
                with self._wake:
                    self._registry_changed = True  # look again: a change may be missed
                    if not self._stop:
                        self._wake.wait(RETRY_S)
                continue
            with self._wake:
                if self._stop or self._registry_changed:
                    continue
                wake_at = min(min(due.values()), self._next_deadline())
                self._wake.wait(max(0.0, min(wake_at - time.monotonic(), 3600.0)))

    def _set_up(self) -> None:
        """First step: the cluster's delay (this auditor's setting if it has none) and
        the registry as it is now."""
        self.manager.initialize_lost_bookie_recovery_delay(
            self.settings.lostBookieRecoveryDelay)
        self._delay_s, self._delay_version = self.manager.lost_bookie_recovery_delay_record(
            self.settings.lostBookieRecoveryDelay)
        self._known = set(self.store.bookies())
        log.info("auditor %s: %d bookies registered, lostBookieRecoveryDelay=%d s",
                 self.auditor_id, len(self._known), self._delay_s)

    def _read_delay(self) -> bool:
        """Take the cluster's delay as BookKeeper's auditor does when it changes: a new
        delay restarts the clock of the missing bookies, and a delay written as 0 or
        written again with the same value (``pybk triggeraudit``) means audit now.
        Whether it means that."""
        delay_s, version = self.manager.lost_bookie_recovery_delay_record(
            self.settings.lostBookieRecoveryDelay)
        if version == self._delay_version:
            return False
        previous, self._delay_s, self._delay_version = self._delay_s, delay_s, version
        if delay_s == 0 or delay_s == previous:
            log.warning("auditor %s: lostBookieRecoveryDelay written as %d s (it was %d s): "
                        "auditing now", self.auditor_id, delay_s, previous)
            return True
        now = time.monotonic()
        with self._wake:
            for bookie_id in self._missing:
                self._missing[bookie_id] = now
        log.info("auditor %s: lostBookieRecoveryDelay is now %d s, counted from now",
                 self.auditor_id, delay_s)
        return False

    def _next_deadline(self) -> float:
        """When missing bookies are to be audited (caller holds the lock): never while
        re-replication is disabled (enabling it wakes the auditor), at once for several,
        when its delay is over for one."""
        if not self._enabled:
            return math.inf
        if len(self._missing) == 1:
            return next(iter(self._missing.values())) + self._delay_s
        return math.inf if not self._missing else time.monotonic()

    # -- lost bookies -----------------------------------------------------------------------

    def _look_at_registry(self) -> None:
        registered = set(self.store.bookies())
        now = time.monotonic()
        with self._wake:
            for bookie_id in sorted(self._known - registered):
                if bookie_id not in self._missing:
                    self._missing[bookie_id] = now
                    log.warning("auditor %s: bookie %s left the registry", self.auditor_id,
                                bookie_id)
            for bookie_id in sorted(registered.intersection(self._missing)):
                del self._missing[bookie_id]
                log.info("auditor %s: bookie %s is back before it was audited: nothing "
                         "to mark", self.auditor_id, bookie_id)
            self._known = registered

    def _audit_lost_bookies(self, now: float, force: bool = False) -> bool:
        """Audit the missing bookies that are lost by now (``force``: all of them);
        whether any was."""
        with self._wake:
            missing = dict(self._missing)
        if not missing:
            return False
        if not force and self._delay_s and len(missing) == 1 \
                and next(iter(missing.values())) + self._delay_s > now:
            return False
        lost = sorted(missing)
        marked = self._mark_ledgers_of(lost)
        log.warning("auditor %s: bookies %s lost: marked %d ledgers under-replicated",
                    self.auditor_id, ", ".join(lost), marked)
        with self._wake:
            for bookie_id in lost:
                if self._missing.get(bookie_id) == missing[bookie_id]:
                    del self._missing[bookie_id]
        return True

    def _mark_ledgers_of(self, lost: list[str]) -> int:
        """Mark every ledger with an entry on a bookie of ``lost``; how many."""
        marked = 0
        try:
            for metadata in self._each_ledger():
                replicas = [b for b in lost if bookie_holds_entries(metadata, b)]
                if replicas:
                    self._mark(metadata.ledger_id, replicas)
                    marked += 1
        finally:
            if marked:
                self.manager.announce_marks()
        return marked

    def _mark(self, ledger_id: int, replicas: list[str]) -> None:
        """Mark one ledger, unannounced (the caller announces its marks at the end)."""
        if self._stop:  # deposed: another auditor may run already
            raise _Closing("the auditor is closing")
        self.manager.mark_underreplicated(
            ledger_id, replicas,
            with_time=self.settings.storeSystemtimeAsLedgerUnderreplicatedMarkTime,
            announce=False)

    def _each_ledger(self) -> Iterator[LedgerMetadata]:
        """Every ledger's metadata, read one ledger at a time as the step goes (ids a
        page at a time: :meth:`~pybk.meta.ledgers.LedgerManager.iter_ledgers`), so a
        step holds one ledger's metadata, whatever the number of ledgers.  Raises
        _Closing once the auditor is closing, so that a long step ends soon (and counts
        as not done)."""
        for versioned in self._ledgers.iter_ledgers():
            if self._stop:
                raise _Closing("the auditor is closing")
            yield versioned.metadata

    # -- the periodic checks --------------------------------------------------------------------

    def _bookie_check(self) -> None:
        """Bookies that hold entries of some ledger but are not registered are missing
        (their cookies say they existed; a bookie without a cookie still holding entries
        counts too).  Bookies that hold nothing are left out: auditing them would mark
        nothing, and, missing, they would make the next lost bookie look like one of
        several lost together."""
        registered = set(self.store.bookies())
        holding: set[str] = set()
        for metadata in self._each_ledger():
            for span in spans(metadata):
                holding.update(b for b in span.ensemble
                               if b not in registered and b not in holding
                               and bookie_holds_entries(metadata, b))
        gone = set(_children(self.store, paths.COOKIES)) - registered
        now = time.monotonic()
        with self._wake:
            for bookie_id in sorted(holding):
                if bookie_id not in self._missing:
                    self._missing[bookie_id] = now
                    log.warning("auditor %s: bookie check: bookie %s holds entries but is "
                                "not registered%s", self.auditor_id, bookie_id,
                                "" if bookie_id in gone else " (and has no cookie)")
            self._wake.notify_all()

    def _ledger_check(self) -> None:
        if not self.manager.is_enabled():
            log.info("auditor %s: re-replication is disabled: ledger check skipped",
                     self.auditor_id)
            return
        registered = set(self.store.bookies())
        checked = marked = 0
        try:
            for metadata in self._each_ledger():
                lacking = bookies_lacking_entries(
                    metadata, registered, self._client_for,
                    self.settings.auditorLedgerVerificationPercentage, READ_TIMEOUT_S)
                checked += 1
                if lacking:
                    self._mark(metadata.ledger_id, sorted(lacking))
                    marked += 1
        finally:
            if marked:
                self.manager.announce_marks()
        log.info("auditor %s: ledger check of %d ledgers marked %d", self.auditor_id,
                 checked, marked)

    # -- the backlog ----------------------------------------------------------------------------

    def _publish_backlog(self) -> None:
        registered = set(self.store.bookies())
        marks = {mark.ledger_id: mark for mark in self.manager.underreplicated()}
        ledgers = entries = 0
        fewest: int | None = None
        for metadata in self._each_ledger():
            mark = marks.get(metadata.ledger_id)
            missing = set(mark.replicas if mark else ())
            for span in spans(metadata):
                missing.update(b for b in span.ensemble if b not in registered)
            found = coverage(metadata, missing, self._last_entry_hint(metadata, registered))
            if mark is not None:
                ledgers += 1
            entries += found.short_entries
            if found.min_replicas is not None:
                fewest = found.min_replicas if fewest is None else min(fewest,
                                                                       found.min_replicas)
        backlog = Backlog(self.auditor_id, time.time_ns() // 1_000_000, ledgers, entries,
                          fewest)
        self.manager.publish_backlog(backlog)
        self.last_backlog = backlog
        log.info("auditor %s: backlog: %d ledgers under-replicated, %d entries lacking a "
                 "replica, fewest replicas of an entry %s", self.auditor_id, ledgers,
                 entries, "-" if fewest is None else fewest)

    def _last_entry_hint(self, metadata: LedgerMetadata, registered: set[str]) -> int | None:
        """An open ledger's highest LAC among its last fragment's live bookies (None for
        a CLOSED ledger, whose metadata says, or if none answers)."""
        if metadata.state is LedgerState.CLOSED:
            return None
        reads = [self._client_for(b).read_lac(metadata.ledger_id)
                 for b in metadata.fragments[-1].ensemble if b in registered]
        best: int | None = None
        for read in reads:
            try:
                lac = read.result(READ_TIMEOUT_S)
            except (BookKeeperError, TimeoutError):
                continue
            best = lac if best is None else max(best, lac)
        return best

    # -- life cycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Tell the thread to stop (it ends its step first); does not wait."""
        with self._wake:
            self._stop = True
            self._wake.notify_all()

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop auditing, waiting at most ``wait_s`` for the thread to end its step."""
        self.stop()
        for watch in self._watches:
            watch.cancel()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait_s)
            if self._thread.is_alive():
                log.warning("auditor %s: its step still waits on the metadata store; it "
                            "ends with that call", self.auditor_id)
        log.info("auditor %s: stopped auditing", self.auditor_id)


class _Closing(BookKeeperError):
    """Ends the step in progress when the auditor closes."""


def _children(store: MetadataStore, path: str) -> list[str]:
    try:
        return store.children(path)
    except BookKeeperError:
        return []
