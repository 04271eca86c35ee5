"""Garbage collection and compaction of entry logs.

* **GC**: an entry log whose ledgers are all deleted (deletion committed to the index) is
  removed.
* **Compaction**: an entry log whose live fraction (bytes of not-deleted ledgers over all
  record bytes) is under a threshold has its live entries copied into the current entry
  log; the index is re-pointed; the old log is removed.

Crash safety, step by step: (1) the copies are appended and fsynced; (2) the index is
re-pointed in one transaction, and only for entries it still points at in the old log;
(3) the old log is removed.  A crash before (2) leaves unreferenced copies (garbage that a
later compaction skips, since the index does not point at them); a crash between (2) and
(3) leaves an old log that the index no longer points into, so the next compaction copies
nothing and removes it.  No step leaves the index pointing at a missing record.

Space left behind
-----------------
The bookie asks for a checkpoint when a ledger is deleted, and the checkpoint that makes
deletions durable starts a GC pass (:mod:`pybk.storage.bookie`).  Once they ran, a
bookie's directories hold, beyond the entries of its live ledgers:

* the journal: the current file and ``journalMaxBackups`` older ones, each at most
  ``journalMaxSizeMB`` of records (or one group of records, if a group alone is larger)
  and ``journalPreAllocSizeMB`` plus a MiB of zeros ahead of them; while appends outrun
  checkpoints, also the files the last checkpoint has not passed yet;
* entry logs: GC removes a log once every ledger in it is deleted, never the current
  one.  When ledgers are deleted in the order they were written, as a log's truncation
  does, deleted entries share at most two logs with live ones: the current log, and the
  log where the live entries begin, so at most ``2 * logSizeLimit`` of them are left.
  Ledgers deleted out of order (a bookie of a cluster) leave partly live logs to
  compaction: logs under ``minorCompactionThreshold`` live at the next minor compaction,
  under ``majorCompactionThreshold`` at the next major one;
* the index: LMDB reuses the pages of deleted entries but never shrinks its file, which
  stays near its largest size, about 70 bytes per entry it held at once.

:func:`space_bound_bytes` adds up the first two.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field

from pybk.errors import CorruptData
from pybk.settings import ServerSettings
from pybk.storage.entrylog import EntryLogger
from pybk.storage.index import Index, LocationUpdate
from pybk.storage.journal import ZERO_FILL_STEP
from pybk.storage.journal_codec import ADD, RECORD

log = logging.getLogger(__name__)

#: Live bytes copied per batch during compaction (bounds its memory).
COMPACTION_BATCH_BYTES = 16 * 1024 * 1024


def space_bound_bytes(settings: ServerSettings) -> int:
    """The most bytes a bookie's journal and entry logs hold beyond the entries of its
    live ledgers once GC ran after the last deletion, for ledgers deleted in the order
    they were written and journal groups under ``journalMaxSizeMB`` (see the module's
    docstring; the index comes on top)."""
    journal_file = ((settings.journalMaxSizeMB + settings.journalPreAllocSizeMB) * 1024 * 1024
                    + ZERO_FILL_STEP)
    return (settings.journalMaxBackups + 1) * journal_file + 2 * settings.logSizeLimit


@dataclass
class GcStats:
    """What one GC or compaction pass did."""

    logs_deleted: list[int] = field(default_factory=list)
    logs_compacted: list[int] = field(default_factory=list)
    entries_moved: int = 0
    bytes_reclaimed: int = 0


@dataclass
class GcStatus:
    """What a bookie's housekeeping thread reports of its compactions (BookKeeper's
    ``GarbageCollectionStatus``): written by that thread, read by others as they are."""

    #: Which compaction runs now: ``"major"``, ``"minor"`` or None.
    compacting: str | None = None
    #: Whether the one running was asked for (:meth:`pybk.storage.Bookie.request_gc`).
    forced: bool = False
    #: Wall-clock ms of the last major and minor compactions' ends (0: none yet).
    last_major_ms: int = 0
    last_minor_ms: int = 0
    major_count: int = 0
    minor_count: int = 0
    #: Compactions an operator suspended (:meth:`pybk.storage.Bookie.suspend_compaction`):
    #: the housekeeping thread skips them, forced or scheduled, until resumed; garbage
    #: collection of entry logs that hold no live ledger goes on.  Not kept across a
    #: restart, as in BookKeeper.
    major_suspended: bool = False
    minor_suspended: bool = False

    def finished(self, major: bool) -> None:
        now_ms = int(time.time() * 1000)
        if major:
            self.last_major_ms, self.major_count = now_ms, self.major_count + 1
        else:
            self.last_minor_ms, self.minor_count = now_ms, self.minor_count + 1
        self.compacting, self.forced = None, False


class GarbageCollector:
    """Frees entry logs of deleted ledgers.

    ``entrylog_lock`` serialises appends to entry logs and log deletions.  A checkpoint
    marks the logs it appended to as *uncommitted* until its index commit is done (see
    :meth:`hold`): such a log may hold records the index does not point at yet, so it is
    neither collected nor compacted meanwhile.  One GC or compaction pass runs at a time.
    """

    def __init__(self, entry_logger: EntryLogger, index: Index,
                 entrylog_lock: threading.Lock) -> None:
        self._logs = entry_logger
        self._index = index
        self._lock = entrylog_lock
        self._pass = threading.Lock()
        self._uncommitted: set[int] = set()

    def hold(self, log_ids: set[int]) -> None:
        """Logs a checkpoint appended to (caller holds ``entrylog_lock``)."""
        self._uncommitted |= log_ids

    def release(self, log_ids: set[int]) -> None:
        """The checkpoint's index commit is done (caller holds ``entrylog_lock``)."""
        self._uncommitted -= log_ids

    def live_fraction(self, log_id: int, deleted: set[int]) -> float:
        ledger_map = self._logs.ledger_maps.get(log_id, {})
        total = sum(ledger_map.values())
        if not total:
            return 0.0
        live = sum(n for ledger, n in ledger_map.items() if ledger not in deleted)
        return live / total

    def _settled(self, log_id: int) -> bool:
        """A log GC may judge: sealed or rolled, its every reference committed.  Caller
        holds ``entrylog_lock``."""
        return (log_id in self._logs.ledger_maps and log_id != self._logs.current_log_id
                and log_id not in self._uncommitted)

    def collect(self, deleted: set[int]) -> GcStats:
        """Remove every settled entry log holding only deleted ledgers."""
        stats = GcStats()
        with self._pass:
            for log_id in self._logs.log_ids():
                with self._lock:
                    if not self._settled(log_id) or self.live_fraction(log_id, deleted) > 0:
                        continue
                    stats.bytes_reclaimed += self._logs.log_sizes.get(log_id, 0)
                    self._logs.delete(log_id)
                stats.logs_deleted.append(log_id)
        return stats

    def compact(self, deleted: set[int], threshold: float) -> GcStats:
        """Compact every settled log whose live fraction is above 0 and under ``threshold``.

        A log with a damaged record in its middle is left alone (and logged): dropping it
        would lose the entries after the damage.
        """
        stats = GcStats()
        with self._pass:
            for log_id in self._logs.log_ids():
                with self._lock:
                    if not self._settled(log_id):
                        continue
                    fraction = self.live_fraction(log_id, deleted)
                    size = self._logs.log_sizes.get(log_id, 0)
                if not 0.0 < fraction < threshold:
                    continue
                try:
                    stats.entries_moved += self._compact_one(log_id, deleted)
                except CorruptData as e:
                    log.error("not compacting: %s", e)
                    continue
                stats.logs_compacted.append(log_id)
                stats.bytes_reclaimed += int(size * (1 - fraction))
        return stats

    def _compact_one(self, log_id: int, deleted: set[int]) -> int:
        moved = 0
        batch: dict[int, list] = {}  # ledger id -> [entry ids, record buffers, old offsets]
        batch_bytes = 0
        for location, ledger_id, entry_id, length, crc in self._logs.scan(log_id, strict=True):
            if ledger_id in deleted:
                continue
            current = self._index.location(ledger_id, entry_id)
            if current is None or (current.log_id, current.offset) != location:
                continue  # superseded, deleted, or an unreferenced leftover
            entry_ids, buffers, old_offsets = batch.setdefault(ledger_id, [[], [], []])
            entry_ids.append(entry_id)
            data = self._logs.read(location, length, ledger_id, entry_id)
            buffers += (RECORD.pack(length, crc, ADD), data)
            old_offsets.append(location.offset)
            batch_bytes += length
            if batch_bytes >= COMPACTION_BATCH_BYTES:
                moved += self._move(log_id, batch)
                batch, batch_bytes = {}, 0
        moved += self._move(log_id, batch)
        with self._lock:
            self._logs.delete(log_id)
        log.info("compacted entry log %x: moved %d entries", log_id, moved)
        return moved

    def _move(self, old_log_id: int, batch: dict[int, list]) -> int:
        """Append the batch's records, sync, then re-point the index where it still
        points at the old copies."""
        moves: list[tuple[LocationUpdate, int, int]] = []
        buffers: list[bytes] = []
        records: list[tuple[int, int, int]] = []  # (ledger id, entry id, old offset)
        for ledger_id, (entry_ids, ledger_buffers, old_offsets) in batch.items():
            buffers += ledger_buffers
            records += zip(itertools.repeat(ledger_id), entry_ids, old_offsets)
        runs = [(ledger_id, len(entry_ids)) for ledger_id, (entry_ids, _b, _o) in batch.items()]
        with self._lock:
            for log_id, first, offsets in self._logs.append_records(buffers, runs):
                for i, offset in enumerate(offsets, first):
                    ledger_id, entry_id, old_offset = records[i]
                    moves.append((LocationUpdate(ledger_id, entry_id, log_id, offset,
                                                 len(buffers[2 * i + 1])),
                                  old_log_id, old_offset))
            self._logs.sync()
        return self._index.relocate(moves)
