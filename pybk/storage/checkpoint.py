"""The checkpoint: what the journal holds moves into entry logs and the index, and then
LastLogMark advances past it, so that older journal files may go.

Between checkpoints a bookie keeps what it acknowledged in memory, as one *generation*:
a write cache of entries (:mod:`pybk.storage.writecache`), the ledgers whose state
changed (key, fence, LACs, deletion) and the ledgers deleted.  A checkpoint
(:meth:`Checkpointer.checkpoint`) makes one generation durable outside the journal:

1. **Cut**, under the bookie's lock, which is the lock under which journal records are
   queued: the bookie hands over its generation (a fresh one takes what follows), and
   the journal is asked for a mark, its position after the last record queued.  So
   every record before the mark is in this generation or an earlier one, and nothing in
   this generation comes after the mark.
2. **Wait for the mark**: the journal reports it once every record before it is
   durable, so nothing the checkpoint writes can be ahead of the journal.
3. **Entry logs** (:func:`flush_generation`): the entries are appended ledger by ledger,
   all ledgers in one append (a ``writev`` per ``flushEntrylogBytes`` step, whatever the
   number of ledgers), and the logs are fsynced.  Until step 4 is
   done, GC leaves the logs appended to alone: they hold records the index does not
   point at yet.
4. **Index**: one LMDB transaction points the entries at their logs, stores the ledger
   states, drops the deleted ledgers' entries and records the last entry log id.
5. **LastLogMark** (:mod:`pybk.storage.lastmark`) is written, atomically, into every
   ledger directory; then journal files wholly before it are removed, keeping
   ``journalMaxBackups``.

Ordering guarantee: LastLogMark never passes a record whose effect is not durable in the
entry logs and the index, because steps 3 and 4 finish before step 5 begins and the cut
put every record before the mark into this generation or an earlier, already
checkpointed one.  A crash at any step therefore loses nothing acknowledged: the next
start replays the journal from the previous mark, and replay is idempotent (an entry
replayed again is written again, and the index points at the newer copy).

Failures: if step 3 or 4 fails, the generation goes back to the bookie (older records
before newer ones) and the mark does not move, so the next checkpoint retries it.  If
the journal has failed and no mark can be taken, the generation is still flushed (it
holds only acknowledged records) but LastLogMark stays.  One checkpoint runs at a time.

Scheduling: a thread (``pybk-sync``) checkpoints every ``flushInterval`` ms, and at
once when asked (:meth:`Checkpointer.request`: a full write cache half, a deletion);
the bookie checkpoints once more at close.
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Callable, Iterator, NamedTuple, Sequence

from pybk.errors import BookKeeperError
from pybk.fileio import DEFAULT_IO, Buffer, FileIO
from pybk.settings import ServerSettings
from pybk.storage.entrylog import EntryLogger
from pybk.storage.gc import GarbageCollector
from pybk.storage.index import Index, StateRow, deleted_ledgers_of
from pybk.storage.journal import Journal, Waiter
from pybk.storage.journal_codec import LogMark
from pybk.storage.lastmark import write_mark
from pybk.storage.writecache import WriteCache

log = logging.getLogger(__name__)


class Generation(NamedTuple):
    """What one checkpoint makes durable: everything acknowledged between two cuts."""

    #: The entries added.
    cache: WriteCache
    #: The states of the ledgers that changed, as the index stores them.
    states: dict[int, StateRow]
    #: The ledgers deleted (their entries leave the index).
    deletes: set[int]


def flush_generation(generation: Generation, entry_logs: EntryLogger, index: Index,
                     gc: GarbageCollector, entrylog_lock: threading.Lock) -> set[int]:
    """Steps 3 and 4: write a generation's entries to entry logs (synced), then commit
    the index.  Returns the ledgers whose deletion is now durable (GC may reclaim them).

    Entries of ledgers deleted in the generation are not written.
    """
    cache, states, deletes = generation
    gone = deletes.union(deleted_ledgers_of(states))
    # Every ledger's records in one sequence: one append (a writev per flushEntrylogBytes
    # step, not per ledger) and index items built in C for all of them.
    buffers, entry_ids, runs = cache.records(gone)
    flush_records(buffers, entry_ids, runs, states, deletes, entry_logs, index, gc,
                  entrylog_lock)
    return gone


def flush_records(buffers: Sequence[Buffer], entry_ids: list[int], runs: list[tuple[int, int]],
                  states: dict[int, StateRow], deletes: set[int],
                  entry_logs: EntryLogger, index: Index, gc: GarbageCollector,
                  entrylog_lock: threading.Lock) -> None:
    """Append records (``buffers`` = record header, entry, ...; ``runs`` = ``(ledger id,
    number of records)`` in order) to entry logs, sync them, then commit their index
    items with ``states`` and ``deletes`` in one transaction.  The cost is per byte and
    per record, with a few C-level operations per run."""
    ledger_ids = list(itertools.chain.from_iterable(
        itertools.starmap(itertools.repeat, runs)))  # one per record
    items: list[Iterator[tuple[bytes, bytes]]] = []  # lazy: LMDB packs them in C
    touched: set[int] = set()
    try:
        with entrylog_lock:
            try:
                for log_id, first, offsets in entry_logs.append_records(buffers, runs):
                    touched.add(log_id)
                    last = first + len(offsets)
                    items.append(Index.record_items(
                        ledger_ids[first:last], entry_ids[first:last], log_id, offsets,
                        map(len, buffers[2 * first + 1:2 * last:2])))
            finally:
                gc.hold(touched)  # until the index points at what was appended
            entry_logs.sync()
            last_log_id = entry_logs.last_log_id
        index.commit_checkpoint(itertools.chain.from_iterable(items), states, deletes,
                                last_log_id)
    finally:
        with entrylog_lock:
            gc.release(touched)


class Checkpointer:
    """Runs a bookie's checkpoints (see the module docstring), on demand and on its
    thread.

    The bookie lends its parts as callables:

    * ``cut()`` hands over the bookie's generation and starts a new one; it is called
      with ``lock`` held, ``lock`` being the ``queue_lock`` of ``journal``;
    * ``flush(generation)`` makes a generation durable (:func:`flush_generation`) and
      lets go of it;
    * ``restore(generation)`` takes back a generation whose flush failed, called with
      ``lock`` held.
    """

    def __init__(self, settings: ServerSettings, journal: Journal, lock: threading.Lock,
                 cut: Callable[[], Generation], flush: Callable[[Generation], None],
                 restore: Callable[[Generation], None], io: FileIO = DEFAULT_IO) -> None:
        self._ledger_dirs = list(settings.ledgerDirectories)
        self._interval_s = settings.flushInterval / 1000.0
        self._journal_max_backups = settings.journalMaxBackups
        self._journal = journal
        self._lock = lock
        self._cut = cut
        self._flush = flush
        self._restore = restore
        self._io = io
        self._one_at_a_time = threading.Lock()
        self._persisted_mark: LogMark | None = None  # the LastLogMark written last
        self._wanted = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def checkpoint(self) -> LogMark | None:
        """Make the current generation durable and persist LastLogMark.

        Returns the new mark (None if the journal has failed and no mark could be
        taken).  Raises what a failed flush raised, leaving the mark where it was.
        """
        with self._one_at_a_time:
            waiter = Waiter()
            with self._lock:
                generation = self._cut()
                try:
                    self._journal.mark_locked(waiter)
                except BookKeeperError:
                    waiter(None)  # the journal failed or closed: flush, move no mark
            mark = waiter.wait()
            try:
                self._flush(generation)
            except BaseException:
                with self._lock:
                    self._restore(generation)
                log.warning("checkpoint failed; its %d bytes of entries stay in the write "
                            "cache", generation.cache.size_bytes)
                raise
            if not isinstance(mark, LogMark):
                return None
            if mark != self._persisted_mark:  # else the journal did not move: no sync needed
                write_mark(self._ledger_dirs, mark, self._io)
                self._persisted_mark = mark
                self._journal.remove_old_files(mark, self._journal_max_backups)
            return mark

    # -- the thread ------------------------------------------------------------------

    @property
    def threaded(self) -> bool:
        """Whether :meth:`start` was called: a thread checkpoints when asked to."""
        return self._thread is not None

    def start(self) -> None:
        """Start the thread that checkpoints every ``flushInterval`` and when asked."""
        self._thread = threading.Thread(target=self._run, name="pybk-sync", daemon=True)
        self._thread.start()

    def request(self) -> None:
        """Ask the thread for a checkpoint now, not at the end of its interval."""
        self._wanted.set()

    def stop(self) -> None:
        """Stop the thread (after the checkpoint it is running, if any)."""
        self._stop.set()
        self._wanted.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wanted.wait(self._interval_s)
            if self._stop.is_set():
                return
            self._wanted.clear()
            try:
                self.checkpoint()
            except Exception:  # keep checkpointing; the next attempt may succeed
                log.exception("checkpoint failed")
