"""A bookie's directories read from another process, while the bookie runs or after it
stopped: what :func:`pybk.open_readonly` reads a WAL through.

A :class:`BookieReader` writes nothing, takes no lock a bookie takes, and no bookie ever
waits for it.  What it reads, and why each read is safe beside a running bookie:

* **The LMDB index**, as a registered LMDB reader (:class:`~pybk.storage.index.Index`
  ``beside_writer``): each lookup is one short read transaction that sees the last
  committed checkpoint.
* **The entry logs**, only at the locations the index gives, which point at records that
  were fsync'd before the index committed.  Every record is checked (ledger id, entry id,
  length, checksum: :func:`~pybk.storage.entrylog.entry_of_record`) before it is served.
  Compaction re-points the index before it deletes a log, so a log found missing, or a
  record that no longer checks, is looked up again in a new transaction.  Descriptors of
  logs deleted meanwhile are closed at the next refresh, so their space comes back.
* **The journal after the LastLogMark**: what the bookie acknowledged since its last
  checkpoint.  Files are scanned as replay scans them (records end at the first torn or
  not yet written one); a file is left for the next one only once the next one exists,
  which the bookie creates after its last write to the previous.  Entries found there
  are kept in memory until a later mark covers them (the checkpoint put them in the
  index before it wrote the mark), so memory stays within about one checkpoint's worth.
  A file the bookie removed because a mark passed it is skipped for that mark.
  What those records say of each ledger (its LACs, its deletion) is kept the same way:
  until a mark passes the last record that changed it, since the checkpoint that wrote
  the mark first committed the state of every ledger changed before it to the index.
  So the reader holds facts of at most the ledgers named in the journal after the
  mark (:attr:`ReaderStats.learned_ledgers`), never of every ledger it ever saw.

Each :meth:`BookieReader.refresh` (every :meth:`read_lac`, and a read that misses) reads
the marks and scans the journal from where the last one stopped.

**The LAC.**  :meth:`read_lac` answers what a bookie answers (the highest LAC carried by a
stored entry or set explicitly) while a bookie runs on the directories: it holds the
presence lock (:func:`~pybk.storage.bookie.owner_path`), which the reader asks about
without taking it.  With ``sole_copy`` (every ledger has this bookie as its only copy,
E = Qw = Qa = 1, as in an embedded WAL) and no bookie running, nothing can add to a
ledger any more, and the answer is the last entry of the unbroken run of stored entries
after that LAC: exactly where recovery will close the ledger, since with one copy every
entry found is kept and the first one missing ends it.  So a reader sees every entry the
bookie made durable, also those whose acknowledgement died with the writer.

**Deferred sync** (adds of ``DEFERRED_SYNC`` ledgers, acknowledged once written to the
journal, before fdatasync).  The reader reads the journal through the page cache, so it
finds such entries as soon as the bookie wrote them, synced or not; what it serves is
still bounded by the LAC above.  While the bookie runs, that LAC is the one the writer
sends, the *durable* LAC (what its last force covered: :mod:`pybk.client.deferred`), so
entries written but not yet forced are not read through a ledger client, however long
they sit in the journal.  With ``sole_copy`` and no bookie running, the unbroken run of
stored entries includes the unsynced ones: a killed process leaves them in the page
cache, where the bookie's replay finds them too, so the reader sees exactly what the
recovery at the next open keeps.  A power cut or a kernel crash may take them away
before either reads them (the scan stops at the torn tail, as replay does); never other
bytes.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from dataclasses import dataclass

import lmdb

from pybk.errors import BookieReadOnly, BookKeeperError, CorruptData, NoSuchEntry, NoSuchLedger
from pybk.fileio import presence_held
from pybk.settings import ServerSettings
from pybk.storage import journal_codec as codec
from pybk.storage.bookie import owner_path
from pybk.storage.cookie import verify_cookies
from pybk.storage.entries import ENTRY_HEADER, LAST_ENTRY
from pybk.storage.entrylog import (
    CURRENT,
    READ_FDS_MAX,
    RECORD_HEADER_SIZE,
    entry_of_record,
    list_log_files,
)
from pybk.storage.index import Index
from pybk.storage.inspect import current_directory
from pybk.storage.lastmark import read_mark

log = logging.getLogger(__name__)

#: Lookups of an entry that a concurrent compaction may move (each in a new transaction).
_LOOKUPS_MAX = 3


@dataclass
class _Learned:
    """What the journal after the mark says of one ledger (all of it only grows), and
    where the last record that changed it ends: once a mark passes there, the index
    says all of it."""

    end: codec.LogMark = codec.LogMark(0, 0)
    lac: int = -1
    explicit_lac: int | None = None
    deleted: bool = False


@dataclass
class ReaderStats:
    """What a :class:`BookieReader` holds and has done."""

    refreshes: int = 0
    journal_records: int = 0  # scanned since it opened
    tail_entries: int = 0  # kept from the journal now, not yet covered by a mark
    learned_ledgers: int = 0  # ledgers with facts kept from the journal now, likewise


class BookieReader:
    """Read-only access to the bookie storage in ``settings``' directories (see the
    module docstring).  Thread-safe; close it when done."""

    def __init__(self, settings: ServerSettings, sole_copy: bool = False) -> None:
        self.settings = settings
        self._sole_copy = sole_copy
        self._journal_dir = current_directory(settings.journalDirectory, "journal directory")
        self._ledger_dirs = list(settings.ledgerDirectories)
        self._owner = owner_path(settings)
        self.instance_id = verify_cookies(settings)
        index_dir = os.path.join(current_directory(self._ledger_dirs[0], "ledger directory"),
                                 "index")
        try:
            self._index = Index(index_dir, read_only=True, beside_writer=True)
        except lmdb.Error as e:
            raise BookKeeperError(f"cannot read the index in {index_dir}: {e} (a bookie "
                                  "that never started on these directories has none)") from e
        self._lock = threading.Lock()
        self._closed = False
        self.stats = ReaderStats()
        # The journal after the mark: where the next scan starts, the entries found
        # (ledger -> entry -> (entry bytes, the journal position just after it)), in the
        # order found, and what was learned of each ledger, in the order of the records
        # that last changed it (so the ones a new mark covers come first).
        self._scan_at = codec.LogMark(0, 0)
        self._tail: dict[int, dict[int, tuple[bytes, codec.LogMark]]] = {}
        self._found: collections.deque[tuple[codec.LogMark, int, int]] = collections.deque()
        self._learned: collections.OrderedDict[int, _Learned] = collections.OrderedDict()
        self._log_paths: dict[int, str] = {}
        self._log_fds: dict[int, int] = {}
        self.refresh()

    # -- reads -----------------------------------------------------------------------------

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The entry's bytes as added (``LAST_ENTRY``: the last one stored)."""
        with self._lock:
            try:
                found = self._lookup(ledger_id, entry_id)
            except (NoSuchLedger, NoSuchEntry):
                found = None
            if found is None:  # written since the last refresh, maybe
                self._refresh_locked()
                found = self._lookup(ledger_id, entry_id)
            if found is None:
                raise NoSuchEntry(f"ledger {ledger_id} has no entry {entry_id} here")
            return found

    def _lookup(self, ledger_id: int, entry_id: int) -> bytes | None:
        self._check_readable(ledger_id)
        if entry_id == LAST_ENTRY:
            last = self._last_stored(ledger_id)
            if last is None:
                raise NoSuchEntry(f"ledger {ledger_id} holds no entries")
            entry_id = last
        return self._entry(ledger_id, entry_id)

    def read_lac(self, ledger_id: int) -> int:
        """The ledger's LAC as the module docstring says (after a refresh)."""
        with self._lock:
            self._refresh_locked()
            self._check_readable(ledger_id)
            stored = self._index.ledger_state(ledger_id)
            learned = self._learned.get(ledger_id, _Learned())
            explicit = [lac for lac in (learned.explicit_lac, stored and stored.explicit_lac)
                        if lac is not None]
            lac = max([learned.lac, stored.lac if stored else -1, *explicit])
            if self._sole_copy and not presence_held(self._owner):
                while self._entry_present(ledger_id, lac + 1):
                    lac += 1
            return lac

    @property
    def owner_running(self) -> bool:
        """Whether a bookie has the directories open now."""
        return presence_held(self._owner)

    def _check_readable(self, ledger_id: int) -> None:
        if self._closed:
            raise BookKeeperError("the bookie reader is closed")
        learned = self._learned.get(ledger_id)
        stored = self._index.ledger_state(ledger_id)
        if (learned is None and stored is None) or (learned is not None and learned.deleted) \
                or (stored is not None and stored.deleted):
            raise NoSuchLedger(f"ledger {ledger_id} does not exist on this bookie")

    def _entry_present(self, ledger_id: int, entry_id: int) -> bool:
        return entry_id in self._tail.get(ledger_id, {}) or \
            self._index.location(ledger_id, entry_id) is not None

    def _last_stored(self, ledger_id: int) -> int | None:
        present = [i for i in (max(self._tail.get(ledger_id, {}), default=None),
                               self._index.last_entry_id(ledger_id)) if i is not None]
        return max(present) if present else None

    def _entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The entry from the journal's tail, else from the entry logs; None if neither
        has it."""
        kept = self._tail.get(ledger_id, {}).get(entry_id)
        if kept is not None:
            return kept[0]
        problem = ""
        for _ in range(_LOOKUPS_MAX):
            where = self._index.location(ledger_id, entry_id)
            if where is None:
                return None
            try:
                fd = self._log_fd(where.log_id)
                record = os.pread(fd, RECORD_HEADER_SIZE + where.length, where.offset)
                return entry_of_record(record, where.length, ledger_id, entry_id)
            except (FileNotFoundError, CorruptData) as e:
                # Compacted away since the lookup: the index points elsewhere now.
                problem = str(e)
                self._forget_log(where.log_id)
        raise CorruptData(f"ledger {ledger_id} entry {entry_id}: the index points at no "
                          f"valid record ({problem})")

    def _log_fd(self, log_id: int) -> int:
        fd = self._log_fds.get(log_id)
        if fd is not None:
            return fd
        if log_id not in self._log_paths:
            for directory in self._ledger_dirs:
                self._log_paths.update(list_log_files(os.path.join(directory, CURRENT)))
        path = self._log_paths.get(log_id)
        if path is None:
            raise FileNotFoundError(f"entry log {log_id:x} does not exist")
        if len(self._log_fds) >= READ_FDS_MAX:  # dicts keep insertion order
            os.close(self._log_fds.pop(next(iter(self._log_fds))))
        fd = self._log_fds[log_id] = os.open(path, os.O_RDONLY)
        return fd

    def _forget_log(self, log_id: int) -> None:
        fd = self._log_fds.pop(log_id, None)
        if fd is not None:
            os.close(fd)
        self._log_paths.pop(log_id, None)

    # -- following the journal ---------------------------------------------------------------

    def refresh(self) -> None:
        """Take in what the bookie wrote since the last refresh (see the module
        docstring)."""
        with self._lock:
            self._refresh_locked()

    def _refresh_locked(self) -> None:
        if self._closed:
            raise BookKeeperError("the bookie reader is closed")
        self.stats.refreshes += 1
        mark = read_mark(self._ledger_dirs)
        while self._found and self._found[0][0] <= mark:  # in the index now
            _end, ledger_id, entry_id = self._found.popleft()
            entries = self._tail.get(ledger_id)
            if entries is not None and entries.get(entry_id, (b"", None))[1] == _end:
                del entries[entry_id]
                if not entries:
                    del self._tail[ledger_id]
        while self._learned and next(iter(self._learned.values())).end <= mark:
            self._learned.popitem(last=False)  # the index says all of it now
        self._scan_at = max(self._scan_at, mark)
        self._scan_journal()
        self.stats.tail_entries = sum(map(len, self._tail.values()))
        self.stats.learned_ledgers = len(self._learned)
        for log_id in [i for i, path in self._log_paths.items()
                       if i in self._log_fds and not os.path.exists(path)]:
            self._forget_log(log_id)  # deleted by GC: let its space go

    def _scan_journal(self) -> None:
        ids = codec.list_journal_ids(self._journal_dir)
        while True:
            journal_id, offset = self._scan_at
            later = [i for i in ids if i > journal_id]
            if journal_id not in ids:  # removed after a mark passed it, or not made yet
                if not later:
                    return
                self._scan_at = codec.LogMark(later[0], 0)
                continue
            path = os.path.join(self._journal_dir, codec.journal_file_name(journal_id))
            scan = codec.scan_journal(path, offset, check_tail=False)
            try:
                while True:
                    rtype, payload, end, _crc = next(scan)
                    self._apply(rtype, payload, codec.LogMark(journal_id, end))
            except StopIteration as stop:
                end_offset = stop.value.end_offset
            except FileNotFoundError:
                ids = codec.list_journal_ids(self._journal_dir)  # removed meanwhile
                continue
            self._scan_at = codec.LogMark(journal_id, max(offset, end_offset))
            if not later:
                return
            # A later file existed before this scan, so this one was complete: a torn
            # tail here is a crash's, never to be finished.
            self._scan_at = codec.LogMark(later[0], 0)

    def _apply(self, rtype: int, payload: bytes, end: codec.LogMark) -> None:
        self.stats.journal_records += 1
        if rtype == codec.ADD:
            ledger_id, entry_id, lac = ENTRY_HEADER.unpack_from(payload)
            learned = self._learned.get(ledger_id)
            if learned is not None and learned.deleted:
                return
            learned = self._changed(ledger_id, end)
            self._tail.setdefault(ledger_id, {})[entry_id] = (payload, end)
            self._found.append((end, ledger_id, entry_id))
            learned.lac = max(learned.lac, lac)
            return
        fields = codec.decode_payload(rtype, payload)
        if rtype == codec.MASTER_KEY:
            # Journaled only for a ledger the bookie did not know: a new one, whatever
            # was learned of an earlier one of that id (deleted, forgotten since).
            self._learned.pop(fields.ledger_id, None)
            self._changed(fields.ledger_id, end)
            return
        learned = self._changed(fields.ledger_id, end)
        if rtype == codec.EXPLICIT_LAC:
            assert fields.lac is not None
            learned.explicit_lac = max(fields.lac, learned.explicit_lac
                                       if learned.explicit_lac is not None else fields.lac)
        elif rtype == codec.DELETE:
            learned.deleted = True
            self._tail.pop(fields.ledger_id, None)

    def _changed(self, ledger_id: int, end: codec.LogMark) -> _Learned:
        """What was learned of the ledger, about to be changed by the record ending at
        ``end``: kept until a mark passes ``end``."""
        learned = self._learned.get(ledger_id)
        if learned is None:
            learned = self._learned[ledger_id] = _Learned(end)
        else:
            learned.end = end
            self._learned.move_to_end(ledger_id)
        return learned

    # -- what a bookie client may ask besides reads ------------------------------------------

    def refuse(self, what: str) -> BookieReadOnly:
        """The error for a change asked of a reader."""
        return BookieReadOnly(f"{what}: the bookie in {self.settings.journalDirectory} is "
                              "open read-only here; only the process that owns it changes it")

    # -- life cycle ------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in self._log_fds.values():
                os.close(fd)
            self._log_fds.clear()
            self._index.close()

    def __enter__(self) -> "BookieReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
