"""Reading a stopped bookie's files without a Bookie (the offline tools' view of them).

Everything here only reads, with the decoders the bookie itself uses
(:mod:`pybk.storage.journal_codec`, :mod:`pybk.storage.entrylog`,
:mod:`pybk.storage.lastmark`, :mod:`pybk.storage.index`): a journal is scanned, not
replayed; an entry log that was not sealed is read as it is, not sealed; the LMDB index is
opened read-only.  The caller holds the bookie's directory lock
(:func:`pybk.storage.cookie.locked_directories`), so no bookie changes the files
meanwhile.

Directories are the settings' ``journalDirectory`` and ``ledgerDirectories``; their files
are in ``<dir>/current``.  A directory without ``current`` holds no bookie:
BookKeeperError saying so.  Damaged files are reported in what these functions return
(a torn journal tail, a damaged entry log record, an index entry that points nowhere)
wherever a reader can go on past them; a file that cannot be read at all raises
BookKeeperError or OSError.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import BinaryIO, Generator, Generic, Iterator, TypeVar

from pybk.errors import BookKeeperError, CorruptData
from pybk.storage import journal_codec as codec
from pybk.storage.entries import ENTRY_HEADER_SIZE
from pybk.storage.entrylog import (
    CURRENT,
    READ_FDS_MAX,
    RECORD_HEADER_SIZE,
    Location,
    LogHeader,
    ScanEnd,
    entry_of_record,
    list_log_files,
    read_header,
    read_ledger_map,
    scan_records,
)
from pybk.storage.index import Index
from pybk.storage.lastmark import read_directory_mark


def current_directory(directory: str, role: str) -> str:
    """``<directory>/current``; BookKeeperError if it is not there (``role`` names the
    directory in the message: "journal directory", "ledger directory")."""
    current = os.path.join(directory, CURRENT)
    if not os.path.isdir(current):
        raise BookKeeperError(f"{role} {directory} holds no bookie ({current} does not "
                              "exist)")
    return current


# -- the journal ----------------------------------------------------------------------------

@dataclass
class JournalFile:
    """One journal file: what a scan of it found (see :class:`journal_codec.ScanReport`)."""

    journal_id: int
    path: str
    size_bytes: int
    report: codec.ScanReport


@dataclass
class JournalRecord:
    """One record of a journal file, at ``offset`` (its header's), ``size_bytes`` of
    payload, with its decoded fields."""

    offset: int
    record_type: int
    size_bytes: int
    fields: codec.RecordFields

    @property
    def type_name(self) -> str:
        return codec.RECORD_TYPE_NAMES[self.record_type]


def journal_files(journal_dir: str) -> list[JournalFile]:
    """Every journal file of a journal directory, scanned, by id."""
    current = current_directory(journal_dir, "journal directory")
    found = []
    for journal_id in codec.list_journal_ids(current):
        path = os.path.join(current, codec.journal_file_name(journal_id))
        scan = Scan(codec.scan_journal(path))
        try:
            for _record in scan:
                pass
        except OSError as e:
            raise BookKeeperError(f"cannot read journal {path}: {e.strerror}") from None
        assert scan.result is not None
        found.append(JournalFile(journal_id, path, os.path.getsize(path), scan.result))
    return found


def journal_path(journal_dir: str, which: str) -> str:
    """The journal file that ``which`` names: an id (a decimal number), a file name in the
    journal directory, or a path; BookKeeperError if there is no such file."""
    current = current_directory(journal_dir, "journal directory")
    if which.isdigit():
        path = os.path.join(current, codec.journal_file_name(int(which)))
        if not os.path.isfile(path):
            ids = codec.list_journal_ids(current)
            raise BookKeeperError(f"no journal {which} in {current} (it holds "
                                  f"{_id_ranges(ids)})")
        return path
    return _named_file(which, current, "journal file")


def scan_journal_file(path: str) -> Generator[JournalRecord, None, codec.ScanReport]:
    """Yield each valid record of a journal file; the generator's return value is the
    scan's :class:`journal_codec.ScanReport` (where the valid records end, and why).
    BookKeeperError if the file cannot be opened or is of another format version."""
    scan = Scan(codec.scan_journal(path))
    offset = codec.HEADER_SIZE
    try:
        for rtype, payload, end, _crc in scan:
            yield JournalRecord(offset, rtype, len(payload),
                                codec.decode_payload(rtype, payload))
            offset = end
    except OSError as e:
        raise BookKeeperError(f"cannot read journal {path}: {e.strerror}") from None
    assert scan.result is not None
    return scan.result


# -- entry logs -----------------------------------------------------------------------------

@dataclass
class EntryLogFile:
    """One entry log: its header, and its ledger map if it is sealed (None if not sealed,
    or if the map is damaged: ``map_damaged``)."""

    log_id: int
    path: str
    size_bytes: int
    header: LogHeader
    ledger_map: dict[int, int] | None
    map_damaged: bool


@dataclass
class EntryLogRecord:
    """One valid record of an entry log: where it lies, and the entry's ids and length."""

    location: Location
    ledger_id: int
    entry_id: int
    size_bytes: int


def entry_log_paths(ledger_dirs: list[str]) -> dict[int, str]:
    """Every entry log of the ledger directories: id -> path."""
    paths: dict[int, str] = {}
    for directory in ledger_dirs:
        paths.update(list_log_files(current_directory(directory, "ledger directory")))
    return dict(sorted(paths.items()))


def entry_log_files(ledger_dirs: list[str]) -> list[EntryLogFile]:
    """Every entry log of the ledger directories, by id, with its header and ledger map
    (the records are not read)."""
    found = []
    for log_id, path in entry_log_paths(ledger_dirs).items():
        with _open_log(path) as f:
            header = read_header(f, path)
            ledger_map = read_ledger_map(f, header) if header.map_offset else None
            found.append(EntryLogFile(log_id, path, os.fstat(f.fileno()).st_size, header,
                                      ledger_map, bool(header.map_offset) and
                                      ledger_map is None))
    return found


def entry_log_path(ledger_dirs: list[str], which: str) -> str:
    """The entry log that ``which`` names: an id (a decimal number), a file name in a
    ledger directory, or a path; BookKeeperError if there is no such file."""
    paths = entry_log_paths(ledger_dirs)
    if which.isdigit():
        if int(which) not in paths:
            raise BookKeeperError(f"no entry log {which} in the ledger directories (they "
                                  f"hold {_id_ranges(list(paths))})")
        return paths[int(which)]
    by_name = {os.path.basename(p): p for p in paths.values()}
    if which in by_name:
        return by_name[which]
    return _named_file(which, None, "entry log")


def scan_entry_log(path: str) -> Generator[EntryLogRecord, None, ScanEnd]:
    """Yield each valid record of an entry log, up to its ledger map (or its end if not
    sealed); the generator's return value says where the valid records end, and why."""
    with _open_log(path) as f:
        scan = Scan(scan_records(f, read_header(f, path)))
        for location, ledger_id, entry_id, length, _crc in scan:
            yield EntryLogRecord(location, ledger_id, entry_id, length)
    assert scan.result is not None
    return scan.result


def read_entry_body(path: str, record: EntryLogRecord, max_bytes: int) -> bytes:
    """The first ``max_bytes`` (at most) of an entry log record's entry after the entry's
    header (what ``--msg`` shows)."""
    with _open_log(path) as f:
        return os.pread(f.fileno(), min(max_bytes, record.size_bytes - ENTRY_HEADER_SIZE),
                        record.location.offset + RECORD_HEADER_SIZE + ENTRY_HEADER_SIZE)


def _open_log(path: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as e:
        raise BookKeeperError(f"cannot read entry log {path}: {e.strerror}") from None


# -- LastLogMark ----------------------------------------------------------------------------

@dataclass
class DirectoryMark:
    """A ledger directory's LastLogMark: ``mark`` None with ``problem`` saying why
    (missing, damaged)."""

    directory: str
    mark: codec.LogMark | None
    problem: str


def last_marks(ledger_dirs: list[str]) -> list[DirectoryMark]:
    """Each ledger directory's LastLogMark, in the settings' order."""
    marks = []
    for directory in ledger_dirs:
        current_directory(directory, "ledger directory")
        try:
            mark = read_directory_mark(directory)
        except CorruptData as e:
            marks.append(DirectoryMark(directory, None, str(e)))
            continue
        marks.append(DirectoryMark(directory, mark, "" if mark else "no lastMark file "
                                   "(a bookie replays its whole journal)"))
    return marks


# -- the index against the entry logs -------------------------------------------------------

@dataclass
class Inconsistency:
    """An index entry that does not point at a readable, matching entry log record."""

    ledger_id: int
    entry_id: int
    log_id: int
    offset: int
    size_bytes: int
    problem: str


@dataclass
class ConsistencyReport:
    entries_checked: int
    entry_logs: int
    inconsistencies: list[Inconsistency]


def check_consistency(ledger_dirs: list[str]) -> ConsistencyReport:
    """Check every entry of the index (in the first ledger directory) against the entry
    logs: the log exists, its header is intact and carries its id, and the record at the
    entry's offset is an entry record of the indexed length, with a good checksum, of
    that ledger and entry id.  Reads only."""
    paths = entry_log_paths(ledger_dirs)
    index_dir = os.path.join(ledger_dirs[0], CURRENT, "index")
    if not os.path.isfile(os.path.join(index_dir, "data.mdb")):
        raise BookKeeperError(f"ledger directory {ledger_dirs[0]} has no index "
                              f"({index_dir}/data.mdb does not exist)")
    logs = _LogReader(paths)
    problems: list[Inconsistency] = []
    checked = 0
    index = Index(index_dir, read_only=True)
    try:
        for ledger_id, entry_id, where in index.locations():
            checked += 1
            problem = logs.check(ledger_id, entry_id, where.log_id, where.offset,
                                 where.length)
            if problem:
                problems.append(Inconsistency(ledger_id, entry_id, where.log_id,
                                              where.offset, where.length, problem))
    finally:
        index.close()
        logs.close()
    return ConsistencyReport(checked, len(logs.seen), problems)


class _LogReader:
    """Reads index locations' records, keeping at most ``READ_FDS_MAX`` logs open."""

    def __init__(self, paths: dict[int, str]) -> None:
        self._paths = paths
        self._open: dict[int, BinaryIO | str] = {}  # log id -> file, or why it is unusable
        self.seen: set[int] = set()

    def check(self, ledger_id: int, entry_id: int, log_id: int, offset: int,
              length: int) -> str:
        """Why the record at ``(log_id, offset)`` is not that entry; "" when it is."""
        f = self._file(log_id)
        if isinstance(f, str):
            return f
        record = os.pread(f.fileno(), RECORD_HEADER_SIZE + length, offset)
        try:
            entry_of_record(record, length, ledger_id, entry_id)
        except CorruptData as e:
            return str(e)
        return ""

    def _file(self, log_id: int) -> BinaryIO | str:
        found = self._open.get(log_id)
        if found is not None:
            return found
        self.seen.add(log_id)
        path = self._paths.get(log_id)
        if path is None:
            return f"entry log {log_id} does not exist"
        if len(self._open) >= READ_FDS_MAX:  # dicts keep insertion order
            oldest = self._open.pop(next(iter(self._open)))
            if not isinstance(oldest, str):
                oldest.close()
        f = _open_log(path)
        try:
            header = read_header(f, path)
        except BookKeeperError as e:
            f.close()
            found = str(e)
        else:
            if header.log_id != log_id:
                f.close()
                found = f"entry log {path} has log id {header.log_id} in its header"
            else:
                found = f
        self._open[log_id] = found
        return found

    def close(self) -> None:
        for f in self._open.values():
            if not isinstance(f, str):
                f.close()
        self._open.clear()


# -- helpers ---------------------------------------------------------------------------------

T = TypeVar("T")
R = TypeVar("R")


class Scan(Generic[T, R]):
    """A generator's items to iterate over once; :attr:`result` is its return value
    once the iteration ended (the scans here return where the valid records end)."""

    def __init__(self, generator: Generator[T, None, R]) -> None:
        self._generator = generator
        self.result: R | None = None

    def __iter__(self) -> Iterator[T]:
        self.result = yield from self._generator


def _named_file(which: str, directory: str | None, what: str) -> str:
    """``which`` as a path, or as a file name in ``directory``; BookKeeperError if neither
    is a file."""
    for path in (which, *([os.path.join(directory, which)] if directory else [])):
        if os.path.isfile(path):
            return path
    raise BookKeeperError(f"no {what} {which!r}" + (f" (nor in {directory})" if directory
                                                   else ""))


def _id_ranges(ids: list[int]) -> str:
    """``"ids 1-3"``, ``"id 1"`` or ``"none"``: what a directory holds, for an error
    message."""
    if not ids:
        return "none"
    return f"ids {min(ids)}-{max(ids)}" if len(ids) > 1 else f"id {ids[0]}"

