"""The bookie: pybk's storage engine for the ledger entries of one node.

A :class:`Bookie` ties the parts together:

* an add goes into the :class:`~pybk.storage.writecache.WriteCache` (so it can be read at
  once) and into the :class:`~pybk.storage.journal.Journal`; it is acknowledged when its
  journal record is fdatasync'd, or, a *deferred* add (of a ``DEFERRED_SYNC`` ledger),
  once its record is written; :meth:`Bookie.force` makes a ledger's adds durable;
* a checkpoint (every ``flushInterval``, when the write cache is half full, and at close)
  takes a journal mark, writes the cache to an entry log, fsyncs it, commits the index,
  and persists LastLogMark; older journals may then go (:mod:`pybk.storage.checkpoint`);
* at start the journal is replayed from LastLogMark;
* a housekeeping thread collects garbage, compacts entry logs and watches disk usage;
  a deletion asks for a checkpoint at once, and the checkpoint that makes deletions
  durable wakes garbage collection, so a deleted ledger's space comes back within
  moments whatever ``flushInterval`` and ``gcWaitTime`` are (and at start).

Unknown ledgers: a plain add to a ledger the bookie does not know creates it, as on a
BookKeeper bookie, unless its owner guards unknown ledgers
(:meth:`Bookie.guard_unknown_ledgers`, a bookie of a cluster): then such an add to a
ledger id at or below the guard's floor, or covered by the tombstones of the ledgers the
bookie forgot (kept in the index, :class:`~pybk.storage.index.Tombstones`), waits for
the owner's admission check and fails with the error it gives.  A bookie of a cluster
also records where its disks joined (:meth:`Bookie.record_join_floor`): a read of
an entry it does not hold, of a ledger older than that, answers EntryMaybeLost, which
recovery does not count as the entry being absent.  docs/DESIGN.md, "Stale writers", has
the argument.

Read-only: a bookie refuses adds (BookieReadOnly; reads, fences and explicit LACs go
on) while a disk is full (:mod:`pybk.storage.diskcheck`) or while its owner says so
(:meth:`Bookie.set_read_only`, e.g. a node whose registration lapsed).  State listeners
(:meth:`Bookie.add_state_listener`) hear of every change of either, and of the close.

Guarantee: every acknowledged add, fence, explicit LAC and delete survives a crash
(kill -9 or power loss) at any moment; a deferred add survives kill -9 once acknowledged,
and power loss once a force that followed it completed.  An add that was never
acknowledged (or a deferred add never forced) reads back either exactly or as NoSuchEntry
after a crash, never as other bytes.

Thread safety: every public method may be called from any thread.  Completion callbacks
run on the thread that synced the journal (or the guard's, for an add it refused); they
may read, fence and add asynchronously, but a blocking call (``add_entry``,
``delete_ledger``, ``checkpoint``, ``close``) from a callback raises instead of waiting
for the thread it runs on.  A callback that raises is
logged and harms nothing else.
"""

from __future__ import annotations

import itertools
import logging
import operator
import os
import threading
import time
from concurrent.futures import Future
from functools import partial
from typing import Callable, ContextManager, Sequence

from pybk.checksum import crc32c
from pybk.errors import (
    BookieClosed,
    BookieReadOnly,
    BookKeeperError,
    CorruptData,
    DirectoryLocked,
    DiskFull,
    EntryMaybeLost,
    EntryTooLarge,
    LedgerFenced,
    MalformedEntry,
    NoSuchEntry,
    NoSuchLedger,
    Unauthorized,
)
from pybk.fileio import DEFAULT_IO, Buffer, FileIO, hold_presence, lock_file
from pybk.settings import ServerSettings
from pybk.stats import READ_SAMPLE, BookieStats, JournalStats, StorageGauges, StorageStats
from pybk.storage import journal as jr
from pybk.storage import journal_codec as codec
from pybk.storage.checkpoint import Checkpointer, Generation, flush_generation, flush_records
from pybk.storage.cookie import format_directories, verify_cookies
from pybk.storage.diskcheck import DiskMonitor, UsageFunction, free_and_total_bytes, used_fraction
from pybk.storage.entries import ENTRY_HEADER, ENTRY_HEADER_SIZE, LAST_ENTRY
from pybk.storage.entrylog import EntryLogger, Location
from pybk.storage.gc import GarbageCollector, GcStats, GcStatus
from pybk.storage.index import Index, StoredLedgerState, live_ledgers_of
from pybk.storage.lastmark import read_mark
from pybk.storage.writecache import WriteCache

log = logging.getLogger(__name__)

Callback = Callable[[BaseException | None], None]
BatchCallback = Callable[[list[BaseException | None]], None]
# The adds of a run that passed: (positions, entry ids, entries, record headers, highest
# LAC, bytes of the entries).
_CheckedRun = tuple[Sequence[int], Sequence[int], Sequence[Buffer], list[bytes], int, int]
#: Adds of one ledger: ``(ledger id, entry ids, entries, master key, recovery[, deferred])``;
#: the entries may be views (a server's are views of the message they came in: kept as
#: they are until the checkpoint, never copied).
AddRun = (tuple[int, Sequence[int], Sequence[Buffer], bytes, bool]
          | tuple[int, Sequence[int], Sequence[Buffer], bytes, bool, bool])
LacWatcher = Callable[[], object]  # what it returns is ignored
StateListener = Callable[[], None]
#: An owner's check of a plain add that would create a ledger the bookie does not know
#: (:meth:`Bookie.guard_unknown_ledgers`): given the ledger id, a Future that completes
#: with None to take the add, or with the error to refuse it with.  Called on the adding
#: thread: it must not block.
Admission = Callable[[int], Future]


class _NeedsAdmission(Exception):
    """Raised under the lock by the add path for a ledger the guard must check first;
    never leaves the bookie (not a BookKeeperError, so no error handler takes it)."""


class LedgerState:
    """What the bookie knows of one ledger besides its entries."""

    __slots__ = ("master_key", "fenced", "deleted", "lac", "explicit_lac")

    def __init__(self, master_key: bytes, fenced: bool = False, deleted: bool = False,
                 lac: int = -1, explicit_lac: int | None = None) -> None:
        self.master_key = master_key
        self.fenced = fenced
        self.deleted = deleted
        self.lac = lac
        self.explicit_lac = explicit_lac



#: The stored form (:data:`~pybk.storage.index.StateRow`) of a :class:`LedgerState`,
#: built in C: the checkpoint's cut makes one per changed ledger while it holds the
#: bookie's lock (adds wait).
_state_row = operator.attrgetter(*StoredLedgerState._fields)


#: Ledger states kept in memory beyond those of the ledgers changed since the last
#: checkpoint: past this many, a checkpoint drops the idle ones, oldest loaded first
#: (reloaded from the index on demand, one LMDB lookup).  So a bookie holds at most this
#: many states plus those of the ledgers changed since the last checkpoint, whatever the
#: number of ledgers it ever held; a state takes about 250 bytes with its master key.
IDLE_STATES_KEPT = 100_000

#: Adds that may wait at once for the guard's check of their ledger
#: (:meth:`Bookie.guard_unknown_ledgers`); an add that would pass it is refused at once
#: (a BookKeeperError, which its writer takes for a bookie failure: it replaces the
#: bookie).  So a flood of adds to old ledgers the bookie does not know, or a stalled
#: ZooKeeper, holds at most this many adds (and their bytes) in memory, and a server
#: never counts them among the adds in progress that pause its reading
#: (:meth:`Bookie.add_entries_async`'s ``on_parked``).
ADDS_AWAITING_ADMISSION_MAX = 1_000

#: The file whose presence lock a running bookie holds, in ``<journalDirectory>/current``.
OWNER_FILE = "OWNER"


def owner_path(settings: ServerSettings) -> str:
    """Where a running bookie of these directories holds its presence lock
    (:func:`pybk.fileio.hold_presence`)."""
    return os.path.join(settings.journalDirectory, "current", OWNER_FILE)


def _announce_presence(settings: ServerSettings) -> int:
    """Hold the presence lock; -1 where the file system has no OFD locks (readers then
    take the bookie for stopped: see :mod:`pybk.storage.readonly`)."""
    path = owner_path(settings)
    try:
        return hold_presence(path)
    except OSError as e:
        log.warning("%s: no presence lock (%s): read-only readers in other processes will "
                    "read this bookie's ledgers as a stopped bookie's", path, e)
        return -1


def format_bookie(settings: ServerSettings, force: bool = False) -> str:
    """Initialise a new bookie's directories (cookies); returns its instance id."""
    return format_directories(settings, force=force)


class Bookie:
    """The storage engine of one bookie.  Use as a context manager, or call :meth:`close`."""

    def __init__(self, settings: ServerSettings, *, io: FileIO = DEFAULT_IO,
                 disk_usage: UsageFunction = used_fraction,
                 start_background_threads: bool = True) -> None:
        self.settings = settings
        self.instance_id = verify_cookies(settings)
        self._ledger_dirs = list(settings.ledgerDirectories)
        self.journal_dir = os.path.join(settings.journalDirectory, "current")
        self._lock = threading.Lock()            # ledger states, caches, journal order
        self._entrylog_lock = threading.Lock()    # appends to entry logs
        self._cache_space = threading.Condition(threading.Lock())
        self._states: dict[int, LedgerState] = {}
        # Unknown ledgers (guard_unknown_ledgers): the check, its floor, and the ledger
        # ids GC forgot (the index's tombstones; raised by _forget).
        self._admission: Admission | None = None
        self._guard_floor = -1
        self._adds_awaiting_admission = 0  # bounded by ADDS_AWAITING_ADMISSION_MAX
        self._dirty: set[int] = set()
        self._pending_deletes: set[int] = set()
        # ledger id -> {callback: known LAC}: long-poll reads waiting for the LAC to pass
        self._lac_watchers: dict[int, dict[LacWatcher, int]] = {}
        self._active = WriteCache()
        self._flushing: WriteCache | None = None
        self._cache_half_bytes = settings.writeCacheMaxSizeMb * 1024 * 1024 // 2
        self._max_entry = settings.maxEntrySizeBytes
        self._disks_full = False
        self._read_only_reason: str | None = None  # set_read_only()'s
        self._read_only = False  # either of the two: the one flag the add path reads
        self._state_listeners: list[StateListener] = []
        #: Checkpoint and garbage collection figures for :mod:`pybk.http.metrics`.
        self.stats = StorageStats()
        #: Add and read figures for :mod:`pybk.http.metrics` (BookKeeper's BookieStats).
        self.bookie_stats = BookieStats()
        self._closed = False
        self._stop = threading.Event()
        self._gc_wanted = threading.Event()  # deletions became durable; also: at start
        self._gc_wanted.set()
        self._force_gc = False  # request_gc(): a major compaction at the next wake-up
        #: The housekeeping thread's compactions, as they run (read without a lock).
        self.gc_status = GcStatus()
        self._disks = DiskMonitor([settings.journalDirectory, *self._ledger_dirs],
                                  settings.diskUsageThreshold, settings.diskUsageLwmThreshold,
                                  disk_usage)
        self._disks.measure()
        if self._disks.should_become_read_only() and not settings.readOnlyModeEnabled:
            raise DiskFull(f"disk usage over diskUsageThreshold={settings.diskUsageThreshold} "
                           f"in {self._disks.full_directories()} and readOnlyModeEnabled is "
                           "false: not starting")
        self._housekeeping: threading.Thread | None = None
        lock_path = os.path.join(settings.journalDirectory, "current", "LOCK")
        try:
            self._dir_lock = lock_file(lock_path)
        except BlockingIOError:
            raise DirectoryLocked(f"{lock_path} is locked: another bookie (in this or another "
                                  "process) is using these directories") from None
        try:
            # Read-only readers in other processes ask for this lock to learn whether a
            # bookie may still add to a ledger (:mod:`pybk.storage.readonly`).
            self._presence = _announce_presence(settings)
            try:
                self._index = Index(os.path.join(self._ledger_dirs[0], "current", "index"))
            except BaseException:
                if self._presence >= 0:
                    os.close(self._presence)
                raise
        except BaseException:
            os.close(self._dir_lock)
            raise
        # Set in order below; if a step fails, _release_resources closes those already set.
        self._entry_logs: EntryLogger
        self._journal: jr.Journal
        try:
            self._entry_logs = EntryLogger(self._ledger_dirs, settings.logSizeLimit,
                                           self._choose_ledger_dir, io,
                                           self._index.last_log_id(),
                                           settings.flushEntrylogBytes)
            self._gc = GarbageCollector(self._entry_logs, self._index, self._entrylog_lock)
            self._durably_deleted = set(self._index.deleted_ledgers())
            self._forgotten = self._index.tombstones()
            self._join_floor = self._index.join_floor()  # record_join_floor's
            # No state row has a higher ledger id (the highest committed; states above
            # it are in memory): a new ledger, whose id comes from an increasing
            # counter, needs no index lookup.
            self._highest_stored_ledger = self._index.highest_ledger_id()
            self.replayed_records, last_journal_id = self._replay()
            self._journal = jr.Journal(self.journal_dir, settings, io,
                                       first_journal_id=last_journal_id + 1,
                                       queue_lock=self._lock)
            self._checkpointer = Checkpointer(settings, self._journal, self._lock,
                                              self._cut_generation, self._flush,
                                              self._restore_generation, io)
            self.checkpoint()
        except BaseException:
            self._release_resources()
            raise
        self._last_minor = self._last_major = time.monotonic()
        if self._disks.should_become_read_only():
            self._on_disk_full()
        if start_background_threads:
            self._checkpointer.start()
            self._housekeeping = threading.Thread(target=self._housekeeping_loop,
                                                  name="pybk-housekeeping", daemon=True)
            self._housekeeping.start()

    # -- context manager ---------------------------------------------------------

    def __enter__(self) -> "Bookie":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state -------------------------------------------------------------------

    @property
    def is_read_only(self) -> bool:
        """Whether adds are refused: a disk is full, or :meth:`set_read_only` said so."""
        return self._read_only

    @property
    def disks_full(self) -> bool:
        """Whether a disk is over ``diskUsageThreshold`` (at the last check)."""
        return self._disks_full

    def set_read_only(self, reason: str) -> None:
        """Refuse adds with BookieReadOnly naming ``reason`` until :meth:`set_writable`,
        whatever the disks say."""
        with self._lock:
            self._read_only_reason = reason
        self._state_changed()

    def set_writable(self) -> None:
        """Undo :meth:`set_read_only`: adds are taken again unless a disk is full."""
        with self._lock:
            self._read_only_reason = None
        self._state_changed()

    def add_state_listener(self, listener: StateListener) -> None:
        """Call ``listener()`` after every change of :attr:`is_read_only` or
        :attr:`disks_full`, and once the bookie is closed.  It runs on the thread that
        made the change (the housekeeping thread for disk checks): keep it short."""
        self._state_listeners.append(listener)

    def remove_state_listener(self, listener: StateListener) -> None:
        if listener in self._state_listeners:
            self._state_listeners.remove(listener)

    def guard_unknown_ledgers(self, admission: Admission | None,
                              ledger_id_floor: int = -1) -> None:
        """Check plain adds that would create a ledger this bookie may have held, or may
        have been meant to hold, before they are taken; ``None`` stops checking.

        Guarantee: from this call on, a plain (not recovery) add to a ledger the bookie
        does not know, whose id is at or below ``ledger_id_floor`` or covered by the
        tombstones of the ledgers garbage collection forgot here (kept in the index
        across restarts, :class:`~pybk.storage.index.Tombstones`), is taken only once
        ``admission(ledger id)`` completed with None, and fails with the error it
        completed with otherwise; an explicit LAC for such a ledger is refused
        (NoSuchLedger) and makes nothing.  Nothing of a refused ledger is stored.  Adds to
        ledgers the bookie knows, adds to ids above both bounds (a ledger created after
        the floor was taken), recovery adds and fences never wait for ``admission``: the
        normal path pays nothing, and an embedded bookie, which has no guard, nothing at
        all.  At most :data:`ADDS_AWAITING_ADMISSION_MAX` adds wait for ``admission`` at
        once; one more fails at once with a BookKeeperError.
        """
        with self._lock:
            self._admission = admission
            self._guard_floor = ledger_id_floor if admission is not None else -1

    def record_join_floor(self, ledger_id: int) -> int:
        """Record, once, where this bookie's disks joined the cluster, and return it: a
        node calls it with an id from the cluster's ledger id generator before it
        serves.  Recorded in the index: ``ledger_id`` if the bookie held nothing yet
        (fresh disks), else -1 (disks that served before); kept for good once the node
        joined (:meth:`confirm_join_floor`), raised to ``ledger_id`` at the next call
        until then (a start that failed after recording it: the former disks of the id
        may have served ledgers above it meanwhile).

        Guarantee: from this call on, a read of an entry the bookie does not hold, of a
        ledger whose id is below the join floor (created before these disks joined),
        fails with EntryMaybeLost instead of NoSuchEntry or NoSuchLedger, and so does
        the fencing read of such a ledger the bookie did not hold
        (:meth:`not_held_error`): an earlier instance of this bookie's id, whose disks
        were lost, may have acknowledged that entry, so recovery must not count this
        answer as the entry being absent.  A ledger at or above the floor was created
        after the disks joined: every add it sent this bookie's id reached these disks,
        and "not here" stays NoSuchEntry / NoSuchLedger.  An embedded bookie records no
        floor and answers as before.
        """
        floor = self._index.record_join_floor(ledger_id)
        self._join_floor = floor
        return floor

    def confirm_join_floor(self) -> None:
        """The node joined the cluster (it registered): the join floor
        :meth:`record_join_floor` recorded is kept for good."""
        self._index.confirm_join_floor()

    def not_held_error(self, ledger_id: int) -> BookKeeperError:
        """The answer to a fencing read of a ledger this bookie did not hold before the
        fence (:meth:`fence` returned False): NoSuchLedger (BookKeeper's
        NoSuchLedgerExists: the bookie never had it), or EntryMaybeLost below the join
        floor (:meth:`record_join_floor`)."""
        return self._unheld(ledger_id, NoSuchLedger(
            f"ledger {ledger_id} was not on this bookie (fenced now)"))

    def _state_changed(self) -> None:
        with self._lock:
            self._read_only = self._disks_full or self._read_only_reason is not None
        for listener in list(self._state_listeners):
            try:
                listener()
            except Exception:  # a listener's bug must not stop disk checks or a close
                log.exception("bookie state listener %r failed", listener)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def disk_space(self) -> tuple[int, int]:
        """Free and total bytes of the disks holding the ledger directories."""
        return free_and_total_bytes(self._ledger_dirs)

    @property
    def journal_stats(self) -> JournalStats:
        """The journal's figures, for :mod:`pybk.http.metrics`."""
        return self._journal.stats

    @property
    def ledger_states_in_memory(self) -> int:
        """Ledger states held in memory now (bounded: see :data:`IDLE_STATES_KEPT`)."""
        return len(self._states)

    def gauges(self) -> StorageGauges | None:
        """What the bookie holds now, for :mod:`pybk.http.metrics` (None once closed).  Read
        without the bookie's locks, so that a scrape never waits for a checkpoint: each
        figure is one read of a field that another thread replaces whole."""
        if self._closed:
            return None
        flushing = self._flushing
        log_sizes = list(self._entry_logs.log_sizes.values())
        index_bytes, ledgers = self._index.sizes()
        return StorageGauges(
            journal_queue=self._journal.queued_records,
            write_cache_bytes=self._active.size_bytes + (flushing.size_bytes if flushing
                                                         else 0),
            write_cache_entries=self._active.entry_count + (flushing.entry_count if flushing
                                                            else 0),
            entry_logs=len(log_sizes), entry_log_bytes=sum(log_sizes),
            index_bytes=index_bytes, ledgers=max(0, ledgers - len(self._durably_deleted)),
            read_only=self._read_only)

    def _state(self, ledger_id: int) -> LedgerState | None:
        """The ledger's state, loaded from the index on first use.  Caller holds the lock."""
        state = self._states.get(ledger_id)
        if state is None:
            if ledger_id > self._highest_stored_ledger:
                return None
            stored = self._index.ledger_state(ledger_id)
            if stored is None:
                return None
            state = LedgerState(*stored)
            self._states[ledger_id] = state
        return state

    def _readable_state(self, ledger_id: int) -> LedgerState:
        with self._lock:
            state = self._state(ledger_id)
        if state is None or state.deleted:
            raise NoSuchLedger(f"ledger {ledger_id} does not exist on this bookie"
                               + (" (deleted)" if state is not None else ""))
        return state

    def _check_writable(self) -> None:
        if self._closed:
            raise BookieClosed("the bookie is closed")
        if self._read_only:
            reason = self._read_only_reason
            if reason is None:
                reason = (f"a disk is over diskUsageThreshold="
                          f"{self.settings.diskUsageThreshold}")
            raise BookieReadOnly(f"the bookie is read-only: {reason}")
        failure = self._journal.failure
        if failure is not None:
            raise failure

    def _writable_state(self, ledger_id: int, master_key: bytes, records: list[Buffer],
                        guarded: bool = False) -> LedgerState:
        """The ledger's state for a mutation, created on first use.

        A new ledger's MASTER_KEY record (header, payload) is appended to ``records``: the
        caller appends its own records after it and journals them all in one submission
        before releasing the lock.  So the key is written with the mutation that needs it,
        in one write, ahead of it (replay meets the key first, and a torn tail that keeps
        the mutation keeps the key), and the mutation completes only once both are durable
        (written, for a deferred add).  ``guarded``: a mutation that must not create a
        ledger the guard has to check first (:meth:`guard_unknown_ledgers`) raises
        _NeedsAdmission instead.  Caller holds the lock.
        """
        state = self._state(ledger_id)
        if state is None:
            if guarded and self._admission is not None \
                    and (ledger_id <= self._guard_floor
                         or self._forgotten.covers(ledger_id)):
                raise _NeedsAdmission(ledger_id)
            payload = codec.LEDGER_ID.pack(ledger_id) + master_key
            records.append(codec.record_header(codec.MASTER_KEY, payload))
            records.append(payload)
            state = self._states[ledger_id] = LedgerState(master_key)
            self._dirty.add(ledger_id)
            return state
        if state.deleted:
            if state.fenced:
                raise LedgerFenced(f"ledger {ledger_id} was fenced and then deleted")
            raise NoSuchLedger(f"ledger {ledger_id} was deleted")
        if state.master_key != master_key:
            raise Unauthorized(f"wrong master key for ledger {ledger_id}")
        return state

    # -- adds --------------------------------------------------------------------

    def add_entry_async(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                        *, recovery: bool = False, callback: Callback | None = None,
                        deferred: bool = False) -> Future | None:
        """Add an entry; complete once its journal record is durable (``deferred``: once
        it is written, durable after the next :meth:`force`).

        With ``callback``, it is called as ``callback(None)`` or ``callback(error)`` and
        None is returned; otherwise a :class:`concurrent.futures.Future` is returned.
        Errors found before queueing (wrong key, fenced, read-only, too large...) are
        raised at once.  ``recovery`` adds are accepted by a fenced ledger.
        """
        future: Future[None] | None = None
        if callback is None:
            future = Future()
            callback = _future_setter(future)
        try:
            self._add(ledger_id, entry_id, entry, master_key, recovery, callback, True,
                      deferred)
        except _NeedsAdmission:
            self._await_admission(1)
            add_admitted = partial(self._add, ledger_id, entry_id, entry, master_key,
                                   recovery, callback, True, deferred, admitted=True)
            self._admit(ledger_id, 1, add_admitted, callback)
        return future

    def add_entry(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
                  *, recovery: bool = False) -> None:
        """Add an entry and return once it is durable (see :meth:`add_entry_async`)."""
        self._refuse_on_journal_thread("a blocking add_entry()")
        waiter = jr.Waiter()
        try:
            self._add(ledger_id, entry_id, entry, master_key, recovery, waiter, False)
        except _NeedsAdmission:
            self._await_admission(1)
            admitted: Future[None] = Future()
            self._admit(ledger_id, 1, partial(admitted.set_result, None),
                        admitted.set_exception)
            admitted.result()
            self._add(ledger_id, entry_id, entry, master_key, recovery, waiter, False,
                      admitted=True)
        self._journal.wait(waiter)

    def leading(self) -> ContextManager[None]:
        """Adds this thread makes inside the block are written and synced by this thread
        at its end when the journal is idle (no thread switch; their callbacks run here).
        For a caller that is about to wait for them through layers it does not control,
        e.g. an in-process client (see :meth:`commit_queued` for one that does)."""
        return self._journal.leading()

    def commit_queued(self) -> None:
        """Write and sync what is queued on this thread when the journal is idle, and run
        the completions here; when a commit is already running, the journal thread takes
        it next.  For a caller that queued adds with ``wake=False`` (the bookie server,
        once it has read every request that was ready)."""
        self._journal.lead()

    def is_completing_thread(self) -> bool:
        """Whether this thread is running add completions (it must not block on adds)."""
        return self._journal.is_committer_thread()

    def add_entries_async(self, runs: Sequence[AddRun], callback: BatchCallback,
                          wake: bool = True,
                          on_parked: Callable[[int], None] | None = None) -> None:
        """Add runs of entries, of any ledgers, as one journal group.

        ``runs`` holds ``(ledger id, entry ids, entries, master key, recovery[, deferred])``
        tuples, each the adds of one ledger (:class:`pybk.net.wire.AddRun` is one).  Each
        add is checked as :meth:`add_entry_async` checks it: an add that fails alone (too
        large, a header naming another entry) fails alone, and the adds of a run whose
        ledger refuses them (wrong key, fenced...) fail together.  ``callback(errors)`` is
        called once: when every add that passed is durable, with ``errors[i]`` None for a
        durable add and the error of a failed one, counting the adds through the runs in
        order (at once, on this thread, if none passed; on the guard's thread if a run
        waited for it: :meth:`guard_unknown_ledgers`).  A server receiving many adds per
        message pays the locking and the journal hand-off once, and a run's checks and
        caching are a few C-level operations, not a round of Python per add.  When every run
        is ``deferred`` the callback comes once the adds are written (see
        :meth:`add_entry_async`); one durable run makes the whole batch wait for durability.
        ``wake=False`` leaves the journal thread asleep: the caller then calls
        :meth:`commit_queued` (which commits the group on its thread when the journal is
        idle).  ``on_parked(n)`` is called on this thread, before this returns and before
        ``callback``, if ``n`` > 0 of the adds wait for the guard's check: they are not
        queued, and at most :data:`ADDS_AWAITING_ADMISSION_MAX` adds wait at once (those
        past it fail at once), so a caller bounding the adds it has in progress (a
        server pausing its reading) leaves them out.
        """
        self._add_runs(runs, callback, wake, False, on_parked)

    def _add_runs(self, runs: Sequence[AddRun], callback: BatchCallback, wake: bool,
                  admitted: bool, on_parked: Callable[[int], None] | None = None) -> None:
        """:meth:`add_entries_async`; ``admitted``: the runs passed the guard's check
        (:meth:`guard_unknown_ledgers`), so they may create their ledgers."""
        started = time.monotonic()
        errors: list[BaseException | None] = [None] * sum(len(run[1]) for run in runs)
        try:
            if self._read_only or self._closed or self._journal.failure is not None:
                self._check_writable()
        except BookKeeperError as e:
            with self._lock:
                self.bookie_stats.adds_queued(started, 0, 0, 0, len(errors))
            callback([e] * len(errors))
            return
        checked = []
        first = 0
        deferred = True
        for ledger_id, entry_ids, entries, master_key, recovery, *run_flags in runs:
            run_deferred = any(run_flags)
            deferred = deferred and run_deferred
            passed = self._check_run(ledger_id, entry_ids, entries, first, errors)
            if passed is not None:
                checked.append((ledger_id, master_key, bool(recovery), run_deferred,
                                passed))
            first += len(entry_ids)
        self._make_room()
        # The records of every run taken, for one journal submission: the new ledgers'
        # key records (_writable_state), then header, entry, header, entry, ... (the
        # entries as they came: for a server, views of the message), and their byte
        # count, summed per run.
        buffers: list[Buffer] = []
        taken: list[tuple[int, LedgerState, bool, _CheckedRun]] = []
        queued: list[Sequence[int]] = []  # the positions of each run taken
        due: list[LacWatcher] = []
        parked: list[tuple[Sequence[int], AddRun]] = []  # runs the guard checks first
        with self._lock:
            for ledger_id, master_key, recovery, deferred_run, passed in checked:
                positions = passed[0]
                try:
                    state = self._state_for_add(ledger_id, master_key, recovery, buffers,
                                                admitted)
                except BookKeeperError as e:
                    for i in positions:
                        errors[i] = e
                    continue
                except _NeedsAdmission:
                    try:
                        self._await_admission_locked(len(positions))
                    except BookKeeperError as e:
                        for i in positions:
                            errors[i] = e
                        continue
                    # Copied: a waiting run holds its own bytes, not its message's.
                    parked.append((positions, (ledger_id, passed[1], _copies(passed[2]),
                                               master_key, recovery, deferred_run)))
                    continue
                taken.append((ledger_id, state, recovery, passed))
            nbytes = sum(map(len, buffers))  # the key records
            # An entry that is a view keeps its whole message alive.  When an add of the
            # message failed or waits for the guard, the entries kept are copied, so that
            # what the write cache holds is what it counts (a body is never held for the
            # sake of a part of it; bytes are kept as they are).
            keep = _copies if parked or any(errors) else _as_they_are
            added = [0, 0]  # entries of the normal runs, and of the recovery runs
            entry_bytes = 0
            for ledger_id, state, recovery, (positions, entry_ids, entries, record_headers,
                                             lac, run_bytes) in taken:
                entries = keep(entries)
                self._active.put_run(ledger_id, entry_ids, record_headers, entries, run_bytes)
                self._raise_lac_locked(ledger_id, state, lac, due)
                buffers += itertools.chain.from_iterable(zip(record_headers, entries))
                nbytes += run_bytes + codec.RECORD.size * len(record_headers)
                queued.append(positions)
                added[recovery] += len(entry_ids)
                entry_bytes += run_bytes
            # With parked runs, the callback comes once the queued adds and each of them
            # are done; without (the normal path), straight from the journal.
            gather = _Gather(errors, callback, bool(queued) + len(parked)) if parked \
                else None
            if queued:
                def done(result: BaseException | None) -> None:
                    if result is not None:
                        for i in itertools.chain.from_iterable(queued):
                            errors[i] = result
                    if gather is None:
                        callback(errors)
                    else:
                        gather.part_done()
                try:
                    self._journal.submit_many_locked(buffers, nbytes, done, wake, deferred)
                except BookKeeperError as e:  # the journal failed or closed meanwhile
                    for i in itertools.chain.from_iterable(queued):
                        errors[i] = e
                    queued = []
                    added, entry_bytes = [0, 0], 0
                    if gather is not None:
                        gather.parts -= 1
            # Under the lock: adds come from several threads (a server's, the guard's,
            # in-process clients').
            self.bookie_stats.adds_queued(started, added[0], added[1], entry_bytes,
                                          len(errors) - errors.count(None))
        if due:
            _notify(due)
        if gather is not None:
            if on_parked is not None:
                on_parked(sum(len(positions) for positions, _run in parked))
            for positions, run in parked:
                self._admit_run(positions, run, gather)
        elif not queued:
            callback(errors)

    # -- unknown ledgers (guard_unknown_ledgers) ---------------------------------

    def _await_admission(self, count: int) -> None:
        """:meth:`_await_admission_locked`, taking the lock."""
        with self._lock:
            self._await_admission_locked(count)

    def _await_admission_locked(self, count: int) -> None:
        """Count ``count`` adds as waiting for the guard's check (until :meth:`_admit`
        decides them), or raise if that would pass ADDS_AWAITING_ADMISSION_MAX.  Caller
        holds the lock."""
        if self._adds_awaiting_admission + count > ADDS_AWAITING_ADMISSION_MAX:
            raise BookKeeperError(
                f"{self._adds_awaiting_admission} adds already wait for the metadata "
                f"check of ledgers this bookie does not know (at most "
                f"{ADDS_AWAITING_ADMISSION_MAX}): refused, try another bookie")
        self._adds_awaiting_admission += count

    def _admit(self, ledger_id: int, count: int, take: Callable[[], None],
               refuse: Callable[[BaseException], None]) -> None:
        """Ask the guard about ``ledger_id`` for ``count`` adds counted by
        :meth:`_await_admission_locked`; then, no longer counting them, call ``take()``
        (errors it raises go to ``refuse``) or ``refuse(error)``, on the thread that
        completed the check."""
        def decided(check: Future) -> None:
            with self._lock:
                self._adds_awaiting_admission -= count
            error = (BookieClosed("the bookie stopped checking unknown ledgers")
                     if check.cancelled() else check.exception())
            if error is None:
                try:
                    take()
                    return
                except Exception as e:  # refused below: an add never hangs
                    error = e
            if not isinstance(error, BookKeeperError):
                log.error("checking ledger %d for an add failed unexpectedly: %r", ledger_id,
                          error)
                error = BookKeeperError(f"checking ledger {ledger_id} failed: {error!r}")
            refuse(error)

        admission = self._admission
        try:
            if admission is None:  # unguarded meanwhile: taken as any other add
                check: Future = Future()
                check.set_result(None)
            else:
                check = admission(ledger_id)
        except Exception as e:  # a closed guard: refuse, never drop the add
            check = Future()
            check.set_exception(e)
        check.add_done_callback(decided)

    def _admit_run(self, positions: Sequence[int], run: AddRun, gather: "_Gather") -> None:
        """A run of a ledger the guard must check: add it once admitted, with the errors
        going to ``gather``'s positions ``positions``."""
        errors = gather.errors

        def added(run_errors: list[BaseException | None]) -> None:
            for i, error in zip(positions, run_errors):
                errors[i] = error
            gather.part_done()

        def refused(error: BaseException) -> None:
            for i in positions:
                errors[i] = error
            gather.part_done()

        self._admit(run[0], len(positions), partial(self._add_runs, [run], added, True,
                                                    True), refused)

    def _check_run(self, ledger_id: int, entry_ids: Sequence[int], entries: Sequence[Buffer],
                   first: int, errors: list[BaseException | None]
                   ) -> _CheckedRun | None:
        """The checks of a run's adds that need no lock: ``(positions, entry ids, entries,
        journal record headers, highest LAC, bytes of the entries)`` of the adds that
        pass, None if none does.  The errors of those that fail go to ``errors`` (the
        run's first add is at ``first``).

        The usual run passes whole: its checks are C-level passes over the run, and the
        only per-entry steps are those the formats impose (each entry's own header, read
        to check it names this ledger and entry; each journal record's header, with the
        entry's checksum)."""
        sizes = list(map(len, entries))
        if max(sizes) <= self._max_entry and min(sizes) >= ENTRY_HEADER_SIZE:
            ledgers, ids, lacs = zip(*map(ENTRY_HEADER.unpack_from, entries))
            if ledgers.count(ledger_id) == len(ledgers) and list(ids) == list(entry_ids):
                return (range(first, first + len(sizes)), entry_ids, entries,
                        _record_headers(entries, sizes), max(lacs), sum(sizes))
        passed = []  # some add fails: find which, one by one
        for i, entry_id, entry in zip(itertools.count(first), entry_ids, entries):
            try:
                passed.append((i, entry_id, entry, self._check_entry(ledger_id, entry_id,
                                                                     entry)))
            except BookKeeperError as e:
                errors[i] = e
        if not passed:
            return None
        positions, kept_ids, kept, lacs = zip(*passed)
        sizes = list(map(len, kept))
        return positions, kept_ids, kept, _record_headers(kept, sizes), max(lacs), sum(sizes)

    def _add(self, ledger_id: int, entry_id: int, entry: bytes, master_key: bytes,
             recovery: bool, callback: jr.RecordCallback, wake: bool,
             deferred: bool = False, admitted: bool = False) -> None:
        """Check an add, apply back-pressure, then cache and journal it under the lock;
        _NeedsAdmission if the guard must check its ledger first (``admitted``: it did)."""
        started = time.monotonic()
        if self._read_only or self._closed or self._journal.failure is not None:
            self._check_writable()
        lac = self._check_entry(ledger_id, entry_id, entry)
        record_header = _record_headers((entry,), (len(entry),))[0]
        self._make_room()
        due: list[LacWatcher] = []
        key_record: list[Buffer] = []  # a new ledger's (see _writable_state)
        with self._lock:
            state = self._state_for_add(ledger_id, master_key, recovery, key_record,
                                        admitted)
            self._active.put(ledger_id, entry_id, record_header, entry)
            self._raise_lac_locked(ledger_id, state, lac, due)
            records: Sequence[Buffer] = (record_header, entry)
            nbytes = len(record_header) + len(entry)
            if key_record:  # the key first, in the same write
                records = [*key_record, *records]
                nbytes += sum(map(len, key_record))
            self._journal.submit_many_locked(records, nbytes, callback, wake, deferred)
            self.bookie_stats.adds_queued(started, not recovery, recovery, len(entry), 0)
        if due:
            _notify(due)

    def _check_entry(self, ledger_id: int, entry_id: int, entry: Buffer) -> int:
        """The checks of an add that need no lock; the entry's LAC."""
        size = len(entry)
        if size > self._max_entry:
            raise EntryTooLarge(f"entry of {size} bytes is over maxEntrySizeBytes="
                                f"{self._max_entry}")
        if size < ENTRY_HEADER_SIZE:
            raise MalformedEntry(f"entry of {size} bytes is shorter than its "
                                 f"{ENTRY_HEADER_SIZE}-byte header")
        header_ledger, header_entry, lac = ENTRY_HEADER.unpack_from(entry)
        if header_ledger != ledger_id or header_entry != entry_id:
            raise MalformedEntry(f"entry header says ledger {header_ledger} entry "
                                 f"{header_entry}, the add says ledger {ledger_id} entry "
                                 f"{entry_id}")
        return lac

    def _make_room(self) -> None:
        """Back-pressure before an add: bounded write cache, bounded journal queue."""
        if self._active.size_bytes >= self._cache_half_bytes:
            self._wait_for_cache_space()
        self._journal.wait_for_queue_space()

    def _state_for_add(self, ledger_id: int, master_key: bytes, recovery: bool,
                       records: list[Buffer], admitted: bool) -> LedgerState:
        """The state of a ledger taking adds, checked (closed bookie, key, fence); a new
        ledger's key record goes to ``records`` (see :meth:`_writable_state`), unless the
        guard must check a plain add's ledger first (_NeedsAdmission; ``admitted``: it
        did).  Caller holds the lock, and journals ``records`` and the adds after them
        before releasing it."""
        if self._closed:
            raise BookieClosed("the bookie is closed")
        state = self._states.get(ledger_id)
        if state is None or state.master_key != master_key or state.deleted:
            state = self._writable_state(ledger_id, master_key, records,
                                         guarded=not (recovery or admitted))
        if state.fenced and not recovery:
            raise LedgerFenced(f"ledger {ledger_id} is fenced")
        return state

    def _raise_lac_locked(self, ledger_id: int, state: LedgerState, lac: int,
                          due: list[LacWatcher]) -> None:
        """Move the ledger's LAC up to ``lac``, adding the LAC watchers now due to
        ``due``.  Caller holds the lock."""
        if lac > state.lac:
            state.lac = lac
            self._dirty.add(ledger_id)
            if self._lac_watchers:
                due += self._due_lac_watchers(ledger_id, lac)

    def _wait_for_cache_space(self) -> None:
        """Block while both write cache halves are full (bounded memory)."""
        if self._journal.is_committer_thread():
            return  # a completion callback must not wait for the checkpoint it blocks
        if not self._checkpointer.threaded:
            self.checkpoint()  # no sync thread (start_background_threads=False)
            return
        self._checkpointer.request()
        with self._cache_space:
            while self._active.size_bytes >= self._cache_half_bytes and not self._closed:
                self._cache_space.wait(0.1)

    # -- ledger operations -------------------------------------------------------

    def fence(self, ledger_id: int, master_key: bytes) -> Future:
        """Fence a ledger: from now on only recovery adds are accepted (durable, survives
        restart).  The Future completes once the fence is journaled, with whether the
        bookie held the ledger before (False: this fence made it, holding no entries; a
        fencing read answers NoSuchLedger then, as BookKeeper's bookie does)."""
        self._check_journal()
        future: Future = Future()
        payload = codec.LEDGER_ID.pack(ledger_id)
        records: list[Buffer] = []
        with self._lock:
            state = self._state(ledger_id)
            if state is not None and state.deleted:  # recovering it finds nothing
                raise NoSuchLedger(f"ledger {ledger_id} was deleted")
            held = state is not None
            state = self._writable_state(ledger_id, master_key, records)
            _submit_after(self._journal, records, codec.FENCE, payload,
                          _future_setter(future, result=held))
            state.fenced = True
            self._dirty.add(ledger_id)
        return future

    def set_explicit_lac(self, ledger_id: int, lac: int, master_key: bytes) -> Future:
        """Record an explicit LAC (sent by an idle writer); durable when the Future is done."""
        self._check_journal()
        future: Future = Future()
        payload = codec.LEDGER_LAC.pack(ledger_id, lac)
        due: list[LacWatcher] = []
        records: list[Buffer] = []
        with self._lock:
            try:
                state = self._writable_state(ledger_id, master_key, records, guarded=True)
            except _NeedsAdmission:  # a writer's hint only: never worth a check
                raise NoSuchLedger(f"ledger {ledger_id} is not on this bookie") from None
            _submit_after(self._journal, records, codec.EXPLICIT_LAC, payload,
                          _future_setter(future))
            if state.explicit_lac is None or lac > state.explicit_lac:
                state.explicit_lac = lac
                self._dirty.add(ledger_id)
                due = self._due_lac_watchers(ledger_id, lac)
        _notify(due)
        return future

    def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger's entries (durably).  Later adds to it are refused; its space
        is reclaimed by garbage collection."""
        self._refuse_on_journal_thread("delete_ledger()")
        self._check_journal()
        payload = codec.LEDGER_ID.pack(ledger_id)
        waiter = jr.Waiter()
        with self._lock:
            self._journal.submit_locked(codec.record_header(codec.DELETE, payload), payload,
                                        waiter, wake=False)
            # Deleted in the index already (a repeated request): GC may forget the ledger
            # at any moment, so it must not enter a checkpoint's batch again.
            already_durable = ledger_id in self._durably_deleted
            if not already_durable:
                state = self._state(ledger_id)
                if state is None:
                    state = self._states[ledger_id] = LedgerState(b"")
                state.deleted = True
                self._dirty.add(ledger_id)
                self._pending_deletes.add(ledger_id)
                self._active.drop_ledger(ledger_id)
        self._journal.wait(waiter)
        if not already_durable:
            self._checkpointer.request()  # the space can be collected once this is durable

    def force(self, ledger_id: int, first: int = 0, last: int = -1) -> Future:
        """A Future that completes once everything added to the ledger so far is durable
        (deferred adds too: BookKeeper's FORCE_LEDGER), with how many of the entries
        ``first..last`` the bookie held when called (durable then too): a writer counts
        a bookie's force only if it holds every entry of the range it should (it may
        have lost deferred adds in a power cut)."""
        self._readable_state(ledger_id)
        held = self._count_held(ledger_id, first, last)  # every add taken is cached by now
        future: Future = Future()
        self._journal.mark(_future_setter(future, result=held))
        self.bookie_stats.force_ledger += 1
        return future

    def _count_held(self, ledger_id: int, first: int, last: int) -> int:
        """How many of the entries ``first..last`` the bookie holds, at a cost of the
        entries held (a cursor over the index) and at most each cache's size, never a
        lookup per id of the range (any client may ask any range).  The caches are
        looked at before the index, the order in which a flush hands an entry over."""
        held: set[int] = set()
        for cache in [c for c in (self._active, self._flushing) if c is not None]:
            held.update(cache.entry_ids_between(ledger_id, first, last))
        held.update(self._index.entry_ids_between(ledger_id, first, last))
        return len(held)

    def _check_open(self) -> None:
        if self._closed:
            raise BookieClosed("the bookie is closed")

    def _check_journal(self) -> None:
        """Fence, explicit LAC and delete records are tiny and keep working on a read-only
        bookie (recovery must be able to fence it); they need an open, healthy journal."""
        self._check_open()
        if self._journal.failure is not None:
            raise self._journal.failure

    # -- reads -------------------------------------------------------------------

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The entry's bytes as added; ``entry_id=LAST_ENTRY`` (-1) reads the last one.
        An entry not held is NoSuchEntry (NoSuchLedger: the ledger is not held, or was
        deleted), or EntryMaybeLost for a ledger not deleted below the join floor
        (:meth:`record_join_floor`).  Counted in :attr:`bookie_stats`, one read in
        :data:`pybk.stats.READ_SAMPLE` timed."""
        stats = self.bookie_stats
        if stats.reads_until_timed:
            stats.reads_until_timed -= 1
            data = self._read_entry(ledger_id, entry_id)
            stats.read_bytes += len(data)
            return data
        stats.reads_until_timed = READ_SAMPLE - 1
        return stats.timed_read(self._read_entry, ledger_id, entry_id)

    def _read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """:meth:`read_entry`, counting the write cache's hits and misses."""
        self._check_open()
        with self._lock:
            state = self._state(ledger_id)
        if state is None:
            raise self._unheld(ledger_id, NoSuchLedger(
                f"ledger {ledger_id} does not exist on this bookie"))
        if state.deleted:
            raise NoSuchLedger(f"ledger {ledger_id} does not exist on this bookie (deleted)")
        if entry_id == LAST_ENTRY:
            last = self.last_entry_id(ledger_id)
            if last is None:
                raise self._unheld(ledger_id, NoSuchEntry(
                    f"ledger {ledger_id} holds no entries"))
            entry_id = last
        for attempt in range(2):
            for cache in (self._active, self._flushing):
                if cache is not None:
                    data = cache.get(ledger_id, entry_id)
                    if data is not None:
                        # A copy if the cache holds a view of the message the entry came
                        # in (a server's adds): readers get bytes, whoever they are.  (The
                        # test first: calling bytes() on bytes costs a tenth of a read.)
                        self.bookie_stats.write_cache_hits += 1
                        return data if type(data) is bytes else bytes(data)
            self.bookie_stats.write_cache_misses += 1
            location = self._index.location(ledger_id, entry_id)
            if location is None:
                raise self._unheld(ledger_id, NoSuchEntry(
                    f"ledger {ledger_id} has no entry {entry_id} here"))
            try:
                return self._entry_logs.read(Location(location.log_id, location.offset),
                                             location.length, ledger_id, entry_id)
            except (CorruptData, OSError):
                if attempt:
                    raise
                # Compaction may have moved the entry between the lookup and the read.
        raise AssertionError("unreachable")

    def _unheld(self, ledger_id: int, error: BookKeeperError) -> BookKeeperError:
        """``error`` (an entry not held), or EntryMaybeLost below the join floor."""
        if ledger_id < self._join_floor:
            return EntryMaybeLost(f"{error}, and the ledger is older than these disks (join "
                                  f"floor {self._join_floor}): it may have been lost with "
                                  "them")
        return error

    def last_entry_id(self, ledger_id: int) -> int | None:
        """The highest entry id held for the ledger, or None."""
        self._readable_state(ledger_id)
        candidates = [c.last_entry_id(ledger_id) for c in (self._active, self._flushing)
                      if c is not None]
        candidates.append(self._index.last_entry_id(ledger_id))
        present = [c for c in candidates if c is not None]
        return max(present) if present else None

    def entry_ids(self, ledger_id: int) -> list[int]:
        """Every entry id held for the ledger, ascending."""
        self._readable_state(ledger_id)
        ids = set(self._index.entry_ids(ledger_id))
        for cache in (self._active, self._flushing):
            if cache is not None:
                ids.update(cache.entry_ids(ledger_id))
        return sorted(ids)

    def read_lac(self, ledger_id: int) -> int:
        """The highest LAC known: carried by a stored entry, or set explicitly (-1: none)."""
        return _lac_of(self._readable_state(ledger_id))

    def watch_lac(self, ledger_id: int, known_lac: int, callback: LacWatcher) -> bool:
        """Arrange for ``callback()`` once the ledger's LAC (:meth:`read_lac`) passes
        ``known_lac``: the storage half of a long-poll read.

        Returns False, registering nothing, if it already has (read it now).  The
        callback runs once, on the thread that advanced the LAC (the one adding the entry
        or setting the explicit LAC), after the bookie's lock is released: it must be
        short and must not block.  A watcher that is no longer wanted must be removed with
        :meth:`unwatch_lac`.  Raises NoSuchLedger like :meth:`read_lac`.
        """
        with self._lock:
            state = self._state(ledger_id)
            if state is None or state.deleted:
                raise NoSuchLedger(f"ledger {ledger_id} does not exist on this bookie")
            if _lac_of(state) > known_lac:
                return False
            self._lac_watchers.setdefault(ledger_id, {})[callback] = known_lac
            return True

    def unwatch_lac(self, ledger_id: int, callback: LacWatcher) -> None:
        """Remove a watcher set by :meth:`watch_lac` (nothing if it already ran)."""
        with self._lock:
            watchers = self._lac_watchers.get(ledger_id)
            if watchers is not None:
                watchers.pop(callback, None)
                if not watchers:
                    del self._lac_watchers[ledger_id]

    def _due_lac_watchers(self, ledger_id: int, lac: int) -> list[LacWatcher]:
        """Take the ledger's watchers that ``lac`` satisfies.  Caller holds the lock."""
        watchers = self._lac_watchers.get(ledger_id)
        if not watchers:
            return []
        due = [cb for cb, known in watchers.items() if lac > known]
        for cb in due:
            del watchers[cb]
        if not watchers:
            del self._lac_watchers[ledger_id]
        return due

    def read_explicit_lac(self, ledger_id: int) -> int | None:
        """The explicit LAC last set for the ledger, or None."""
        return self._readable_state(ledger_id).explicit_lac

    def is_fenced(self, ledger_id: int) -> bool:
        return self._readable_state(ledger_id).fenced

    def ledger_exists(self, ledger_id: int) -> bool:
        with self._lock:
            state = self._state(ledger_id)
        return state is not None and not state.deleted

    # -- checkpoint --------------------------------------------------------------

    def checkpoint(self) -> codec.LogMark | None:
        """Flush the write cache to entry logs and index, then persist LastLogMark
        (:meth:`pybk.storage.checkpoint.Checkpointer.checkpoint`).

        Returns the new mark (None if the journal has failed and no mark could be taken).
        """
        self._refuse_on_journal_thread("checkpoint()")
        return self._checkpointer.checkpoint()

    def _cut_generation(self) -> Generation:
        """Hand what was acknowledged since the last cut to a checkpoint; reads go on
        finding its entries in ``_flushing`` until :meth:`_flush` is done.  Caller holds
        the lock."""
        dirty = self._dirty
        generation = Generation(self._active, dict(zip(dirty, map(
            _state_row, map(self._states.__getitem__, dirty)))), self._pending_deletes)
        self._flushing = self._active
        self._active = WriteCache()
        self._dirty = set()
        self._pending_deletes = set()
        return generation

    def _flush(self, generation: Generation) -> None:
        """Make a generation durable in entry logs and the index, then let go of it: its
        cache half frees up, and its deletions go to GC."""
        started = time.monotonic()
        gone = flush_generation(generation, self._entry_logs, self._index, self._gc,
                                self._entrylog_lock)
        self.stats.flush.observe_since(started)
        self.stats.flush_bytes.observe(generation.cache.size_bytes)
        with self._lock:
            if self._durably_deleted:
                # A ledger made again after it was forgotten, whose deletion a replay
                # made durable once more: it is live, GC must not take its entries.
                self._durably_deleted.difference_update(live_ledgers_of(generation.states))
            self._durably_deleted |= gone
            if generation.states:  # before any of them may be evicted
                self._highest_stored_ledger = max(self._highest_stored_ledger,
                                                  max(generation.states))
            self._evict_idle_states()
        if gone:
            self._gc_wanted.set()
        self._flushing = None
        with self._cache_space:
            self._cache_space.notify_all()

    def _evict_idle_states(self) -> None:
        """Past :data:`IDLE_STATES_KEPT` states, drop those of ledgers that did not change
        since the last cut, oldest loaded first: the index holds exactly what they say
        (it was committed by this checkpoint or an earlier one), and :meth:`_state`
        loads them again when wanted.  Called after a checkpoint's index commit, with
        the lock held."""
        excess = len(self._states) - IDLE_STATES_KEPT
        if excess <= 0:
            return
        dirty = self._dirty
        idle = list(itertools.islice((lid for lid in self._states if lid not in dirty),
                                     excess))
        for ledger_id in idle:
            del self._states[ledger_id]

    def _restore_generation(self, generation: Generation) -> None:
        """A checkpoint failed: put its generation back so that the next one retries it
        (and no mark moves past records that are in neither an entry log nor the index).
        Caller holds the lock."""
        cache = generation.cache
        cache.absorb(self._active)  # newer records after older ones
        for ledger_id in cache.ledger_ids():
            state = self._states.get(ledger_id)
            if state is not None and state.deleted:
                cache.drop_ledger(ledger_id)
        self._active = cache
        self._flushing = None
        self._dirty |= generation.states.keys()
        self._pending_deletes |= generation.deletes

    # -- replay ------------------------------------------------------------------

    def _replay(self) -> tuple[int, int]:
        """Replay the journal from LastLogMark.

        ADD records go straight to entry logs and the index in journal order, every
        half write cache of bytes (:meth:`_write_replayed`), not through the write cache:
        the cost is per byte and per record, whatever the number of ledgers.  Ledger
        states (key, fence, LACs, deletion) stay in memory, dirty, until the first
        checkpoint writes them all at once; the mark moves only then, so a crash during
        replay replays again from the same mark (an entry written twice is found at its
        later copy).
        """
        mark = read_mark(self._ledger_dirs)
        started = time.monotonic()
        replayed_bytes = 0
        buffers: list[bytes] = []   # record header, entry, record header, entry, ...
        ledger_ids: list[int] = []  # one per record
        entry_ids: list[int] = []
        pending_bytes = 0
        states = self._states  # never replaced (self._dirty is, by each cut)
        pack_header = codec.RECORD.pack
        unpack_entry_header = ENTRY_HEADER.unpack_from

        def write_pending() -> None:
            nonlocal pending_bytes
            if ledger_ids:
                self._write_replayed(buffers, ledger_ids, entry_ids)
                buffers.clear()
                ledger_ids.clear()
                entry_ids.clear()
            pending_bytes = 0

        def apply(rtype: int, payload: bytes, crc: int) -> None:
            nonlocal replayed_bytes, pending_bytes
            size = len(payload)
            replayed_bytes += size
            if rtype == codec.ADD:
                ledger_id, entry_id, lac = unpack_entry_header(payload)
                state = states.get(ledger_id) or self._state(ledger_id)
                if state is None:
                    state = states[ledger_id] = LedgerState(b"")
                    self._dirty.add(ledger_id)
                if state.deleted:
                    return
                if lac > state.lac:
                    state.lac = lac
                    self._dirty.add(ledger_id)
                buffers.append(pack_header(size, crc, codec.ADD))
                buffers.append(payload)
                ledger_ids.append(ledger_id)
                entry_ids.append(entry_id)
                pending_bytes += size
                if pending_bytes >= self._cache_half_bytes:
                    write_pending()
                return
            ledger_id = codec.LEDGER_ID.unpack_from(payload)[0]
            if rtype == codec.MASTER_KEY:
                # Journaled only for a ledger the bookie did not know (neither in memory
                # nor in the index): a new ledger, whatever an earlier incarnation,
                # deleted and forgotten since, left.  No index lookup.
                if ledger_id in self._pending_deletes:
                    # That incarnation's deletion (replayed above) must drop its entries
                    # now, not at the first checkpoint, where it would drop these too.
                    write_pending()
                    self._flush(self._cut_generation())
                states[ledger_id] = LedgerState(payload[codec.LEDGER_ID.size:])
                self._dirty.add(ledger_id)
                return
            state = self._state(ledger_id)
            if state is None:
                state = self._states[ledger_id] = LedgerState(b"")
            if rtype == codec.FENCE:
                state.fenced = True
            elif rtype == codec.EXPLICIT_LAC:
                lac = codec.LEDGER_LAC.unpack_from(payload)[1]
                state.explicit_lac = max(lac, state.explicit_lac if state.explicit_lac
                                         is not None else lac)
            elif rtype == codec.DELETE:
                # Its entries written so far leave the index with the deletion (at the
                # first checkpoint); later ADD records of it are skipped.
                state.deleted = True
                self._pending_deletes.add(ledger_id)
            self._dirty.add(ledger_id)

        records, last_id = codec.replay(self.journal_dir, mark, apply)
        write_pending()
        self._flush(self._cut_generation())  # the states and deletions, once
        elapsed = time.monotonic() - started
        self.replay_stats = {"records": records, "bytes": replayed_bytes, "seconds": elapsed}
        log.info("replayed %d journal records (%d bytes) from %s in %.3f s", records,
                 replayed_bytes, mark, elapsed)
        return records, last_id

    def _write_replayed(self, buffers: list[bytes], ledger_ids: list[int],
                        entry_ids: list[int]) -> None:
        """Write replayed ADD records (in journal order) to entry logs and the index."""
        runs = [(ledger_id, len(list(run))) for ledger_id, run in
                itertools.groupby(ledger_ids)]
        flush_records(buffers, entry_ids, runs, {}, set(), self._entry_logs, self._index,
                      self._gc, self._entrylog_lock)

    # -- housekeeping --------------------------------------------------------------

    def collect_garbage(self) -> GcStats:
        """Remove entry logs that hold only deleted ledgers (deletions already checkpointed),
        then forget the deleted ledgers no entry log holds any more."""
        with self._lock:
            deleted = set(self._durably_deleted)
        stats = self._gc.collect(deleted)
        self._forget(deleted)
        self.stats.gc_runs += 1
        self.stats.reclaimed_deletion_bytes += stats.bytes_reclaimed
        return stats

    def _forget(self, deleted: set[int]) -> None:
        """Of the durably deleted ledgers ``deleted``, drop every trace of those no entry
        log holds (their entries already left the index at the deletion's checkpoint):
        the index rows, the state, the id in ``_durably_deleted``.  From then on the
        bookie knows nothing of such a ledger, as of one it never held."""
        with self._entrylog_lock:
            maps = list(self._entry_logs.ledger_maps.values())
            held = {lid for lid in deleted if any(lid in m for m in maps)}
        gone = deleted - held
        if not gone:
            return
        # The tombstones rise in memory before the index forgets: in between, an add to a
        # ledger whose state is not in memory (evicted) finds no row in the index, and
        # must find the tombstones instead (raising it early only costs checks).
        with self._lock:
            self._forgotten.add(gone)
        self._index.forget_ledgers(sorted(gone))
        with self._lock:
            for ledger_id in gone:
                self._durably_deleted.discard(ledger_id)
                state = self._states.get(ledger_id)
                if state is not None and state.deleted and ledger_id not in self._dirty:
                    del self._states[ledger_id]
        log.info("forgot %d deleted ledgers whose entry logs are gone", len(gone))

    def compact(self, threshold: float) -> GcStats:
        """Copy the live entries of logs under ``threshold`` live fraction, then drop them."""
        with self._lock:
            deleted = set(self._durably_deleted)
        stats = self._gc.collect(deleted)
        compacted = self._gc.compact(deleted, threshold)
        self._forget(deleted)
        self.stats.gc_runs += 1
        self.stats.reclaimed_deletion_bytes += stats.bytes_reclaimed
        self.stats.reclaimed_compaction_bytes += compacted.bytes_reclaimed
        stats.logs_compacted = compacted.logs_compacted
        stats.entries_moved = compacted.entries_moved
        stats.bytes_reclaimed += compacted.bytes_reclaimed
        return stats

    def request_gc(self) -> None:
        """Have the housekeeping thread collect garbage and run a major compaction now,
        whatever the intervals say (BookKeeper's forced GC); returns at once."""
        self._force_gc = True
        self._gc_wanted.set()

    def suspend_compaction(self, *, major: bool, minor: bool) -> None:
        """Stop starting the major and/or minor compactions the housekeeping thread runs
        (scheduled or asked for by :meth:`request_gc`) until :meth:`resume_compaction`;
        one already running finishes.  Entry logs of deleted ledgers are still removed.
        Operators use it during maintenance (BookKeeper's ``suspend_compaction``)."""
        status = self.gc_status
        status.major_suspended |= major
        status.minor_suspended |= minor
        log.info("compaction suspended: major %s, minor %s", status.major_suspended,
                 status.minor_suspended)

    def resume_compaction(self, *, major: bool, minor: bool) -> None:
        """Undo :meth:`suspend_compaction` for the kinds named."""
        status = self.gc_status
        status.major_suspended &= not major
        status.minor_suspended &= not minor
        log.info("compaction resumed: major suspended %s, minor suspended %s",
                 status.major_suspended, status.minor_suspended)

    @property
    def is_in_force_gc(self) -> bool:
        """Whether a requested GC is waiting or running."""
        return self._force_gc or self.gc_status.forced

    def check_disks(self) -> None:
        """Measure disk usage now and go read-only / writable as the thresholds say."""
        self._disks.measure()
        if not self._disks_full and self._disks.should_become_read_only():
            self._on_disk_full()
        elif self._disks_full and self._disks.may_become_writable():
            log.warning("disk usage back under diskUsageLwmThreshold=%s: bookie writable again",
                        self.settings.diskUsageLwmThreshold)
            self._disks_full = False
            self._state_changed()

    def _on_disk_full(self) -> None:
        full = self._disks.full_directories()
        if self.settings.readOnlyModeEnabled:
            log.warning("disk usage over diskUsageThreshold=%s in %s: bookie read-only",
                        self.settings.diskUsageThreshold, full)
            self._disks_full = True
            self._state_changed()
        else:
            log.error("disk usage over diskUsageThreshold=%s in %s and readOnlyModeEnabled is "
                      "false: shutting the bookie down", self.settings.diskUsageThreshold, full)
            self._disks_full = True
            self._state_changed()
            threading.Thread(target=self.close, name="pybk-shutdown", daemon=True).start()

    def _choose_ledger_dir(self) -> str:
        full = set(self._disks.full_directories())
        candidates = [d for d in self._ledger_dirs if d not in full] or self._ledger_dirs
        return self._disks.least_used(candidates)

    def _housekeeping_loop(self) -> None:
        gc_interval = self.settings.gcWaitTime / 1000.0
        disk_interval = self.settings.diskCheckInterval / 1000.0
        next_disk_check = time.monotonic() + disk_interval
        while True:
            self._gc_wanted.wait(min(gc_interval, disk_interval))
            if self._stop.is_set():
                return
            self._gc_wanted.clear()
            try:
                now = time.monotonic()
                if now >= next_disk_check:
                    self.check_disks()
                    next_disk_check = now + disk_interval
                self._scheduled_gc(now)
            except Exception:
                log.exception("housekeeping failed")

    def _scheduled_gc(self, now: float) -> None:
        s, suspended = self.settings, self.gc_status
        forced, self._force_gc = self._force_gc, False
        if not suspended.major_suspended and (
                forced or (s.majorCompactionInterval
                           and now - self._last_major >= s.majorCompactionInterval)):
            self._last_major = self._last_minor = now
            self._compact_now(True, forced)
            self.stats.major_compactions += 1
        elif not suspended.minor_suspended and s.minorCompactionInterval \
                and now - self._last_minor >= s.minorCompactionInterval:
            self._last_minor = now
            self._compact_now(False, False)
            self.stats.minor_compactions += 1
        else:
            self.collect_garbage()

    def _compact_now(self, major: bool, forced: bool) -> None:
        status = self.gc_status
        status.compacting, status.forced = "major" if major else "minor", forced
        try:
            self.compact(self.settings.majorCompactionThreshold if major
                         else self.settings.minorCompactionThreshold)
        finally:
            status.finished(major)

    # -- shutdown ----------------------------------------------------------------

    def close(self) -> None:
        """Finish queued work, checkpoint, and release every file and thread.

        Not from a completion callback (it would wait for the journal thread it runs on).
        """
        self._refuse_on_journal_thread("close()")
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._gc_wanted.set()
        try:
            self._checkpointer.stop()
            housekeeping = self._housekeeping
            if housekeeping is not None and housekeeping is not threading.current_thread():
                housekeeping.join()
            try:
                self._journal.sync()
            except BookKeeperError:
                pass  # the journal failed earlier; what it holds is replayed at next start
            self.checkpoint()
        finally:
            self._release_resources()
            self._state_changed()
        log.info("bookie closed")

    def _release_resources(self) -> None:
        """Close the journal, the entry logs and the index, whatever state they are in."""
        with self._cache_space:
            self._cache_space.notify_all()
        journal: jr.Journal | None = getattr(self, "_journal", None)
        if journal is not None:
            journal.close()
        if hasattr(self, "_entry_logs"):
            with self._entrylog_lock:
                try:
                    self._entry_logs.close()
                except OSError as e:  # a full or failing disk: the next start rescans
                    log.error("could not seal the current entry log: %s", e)
        self._index.close()
        if self._presence >= 0:
            os.close(self._presence)
        os.close(self._dir_lock)

    def _refuse_on_journal_thread(self, what: str) -> None:
        if self._journal.is_committer_thread():
            raise BookKeeperError(f"{what} from a completion callback would wait for the "
                                  "thread it runs on; call it from another thread")


class _Gather:
    """Calls a batch's callback with its errors once each of its ``parts`` is done (the
    adds journaled together, and each run the guard checked first)."""

    __slots__ = ("errors", "callback", "parts", "_lock")

    def __init__(self, errors: list[BaseException | None], callback: BatchCallback,
                 parts: int) -> None:
        self.errors = errors
        self.callback = callback
        self.parts = parts
        self._lock = threading.Lock()

    def part_done(self) -> None:
        with self._lock:
            self.parts -= 1
            last = self.parts == 0
        if last:
            self.callback(self.errors)


def _copies(entries: Sequence[Buffer]) -> Sequence[Buffer]:
    """``entries`` as bytes: a copy of each view, the same object for each bytes."""
    return list(map(bytes, entries))


def _as_they_are(entries: Sequence[Buffer]) -> Sequence[Buffer]:
    return entries


def _lac_of(state: LedgerState) -> int:
    explicit = state.explicit_lac if state.explicit_lac is not None else -1
    return max(state.lac, explicit)


def _notify(watchers: list[LacWatcher]) -> None:
    for watcher in watchers:
        try:
            watcher()
        except Exception:  # a watcher's bug must not fail the add that advanced the LAC
            log.exception("a LAC watcher raised")


def _record_headers(entries: Sequence[Buffer], sizes: Sequence[int]) -> list[bytes]:
    """The journal record headers of ADD records of ``entries`` (of ``sizes`` bytes),
    built in C."""
    return list(map(codec.RECORD.pack, sizes,
                    map(crc32c, entries, itertools.repeat(codec.ENTRY_CRC_SEED)),
                    itertools.repeat(codec.ADD)))


def _submit_after(journal: jr.Journal, records: list[Buffer], record_type: int,
                  payload: bytes, callback: jr.RecordCallback) -> None:
    """Journal a record after ``records`` (a new ledger's key record, or none), all in one
    submission completed by ``callback``.  Caller holds the journal's queue lock."""
    records.append(codec.record_header(record_type, payload))
    records.append(payload)
    journal.submit_many_locked(records, sum(map(len, records)), callback)


def _future_setter(future: Future, result: object = None) -> Callable[[object], None]:
    def complete(outcome: object) -> None:
        if future.cancelled():
            return  # the caller gave up on it; the record is durable all the same
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(result)
    return complete
