"""Entry logs: the entries of all ledgers, interleaved in large append-only files.

The checkpoint moves entries from the write cache into the current entry log (ledger by
ledger, so a ledger's entries sit together), fsyncs it, and only then points the index at
them.  A log is rolled at ``logSizeLimit``; a rolled log is *sealed*: its
ledger map (which ledgers it holds, and how many bytes each) is appended and the header
points at it, so garbage collection knows what a log holds without reading it.

File format
-----------
Files are ``<ledger dir>/current/<log id as 16 hex digits>.log``; ids increase across all
ledger directories.  A new log is created as ``<name>.log.new`` and renamed once its
header is durable.  All integers are big-endian.

Header, 64 bytes::

    0   8  magic  b"PYBKELOG"
    8   4  format version (1)
    12  4  header length (64)
    16  8  log id
    24  8  offset of the ledger map (0 while the log is not sealed)
    32  4  number of ledgers in the map
    36 24  zero
    60  4  CRC-32C of bytes 0..59

Records follow back to back from offset 64.  A record is exactly the entry's journal
ADD record (see :mod:`pybk.storage.journal_codec`), so the bytes the journal wrote are reused::

    0   4  entry length N
    4   4  checksum: CRC-32C of the type byte followed by the entry
    8   1  type (1, ADD)
    9   N  the entry; its first 16 bytes are its ledger id and entry id

The ledger map, written when the log is sealed, at the end of the file::

    0   4  magic b"LMAP"
    4   4  number of ledgers M
    8  16M ledger id (8), bytes of that ledger's records, headers included (8)
    ..  4  CRC-32C of the map's preceding bytes

Crash guarantees
----------------
The index only ever points at records that were fsynced before the index was committed.
A log that was not sealed when the bookie stopped is scanned at the next start (the scan
stops at the first damaged record: an unsynced, torn tail that nothing points at) and
sealed then, its map appended at the end of the file.  Reads verify the checksum and
raise :class:`pybk.errors.CorruptData` on a mismatch instead of returning bad bytes.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import operator
import os
import struct
import threading
from typing import BinaryIO, Callable, Generator, Iterator, NamedTuple, Sequence

from pybk.checksum import crc32c
from pybk.errors import BookKeeperError, CorruptData
from pybk.fileio import DEFAULT_IO, Buffer, FileIO, fsync_directory
from pybk.storage.journal_codec import ADD, ENTRY_CRC_SEED, RECORD

log = logging.getLogger(__name__)

MAGIC = b"PYBKELOG"
VERSION = 1
HEADER = struct.Struct(">8sIIQQI24x")
HEADER_SIZE = HEADER.size + 4
assert HEADER_SIZE == 64, "the entry log header is documented as 64 bytes"
RECORD_HEADER_SIZE = RECORD.size  # entry length, checksum, type
ENTRY_IDS = struct.Struct(">QQ")
MAP_MAGIC = b"LMAP"
MAP_HEAD = struct.Struct(">4sI")
MAP_ITEM = struct.Struct(">QQ")
assert (MAP_HEAD.size, MAP_ITEM.size) == (8, 16), \
    "the ledger map is documented as 8 + 16M + 4 bytes"
SUFFIX = ".log"
NEW_SUFFIX = ".new"
CURRENT = "current"
#: Entry logs kept open for reading at once; the longest open is closed to make room, so
#: a bookie with thousands of (small) entry logs never runs out of file descriptors.
READ_FDS_MAX = 128


class Location(NamedTuple):
    """Where a record lies: log id and the offset of its record header."""

    log_id: int
    offset: int


#: Where records landed: ``(log id, index of the first of them among the records appended
#: by one call, offsets of the records)``.
Placement = tuple[int, int, list[int]]


def log_file_name(log_id: int) -> str:
    return f"{log_id:016x}{SUFFIX}"


def entry_crc(entry: bytes) -> int:
    """The checksum an entry log record (and a journal ADD record) carries for ``entry``."""
    return crc32c(entry, ENTRY_CRC_SEED)


def _header_bytes(log_id: int, map_offset: int, map_count: int) -> bytes:
    head = HEADER.pack(MAGIC, VERSION, HEADER_SIZE, log_id, map_offset, map_count)
    return head + struct.pack(">I", crc32c(head))


def list_log_files(directory: str) -> dict[int, str]:
    """The entry logs in ``directory`` (a ledger directory's ``current``): id -> path."""
    return {int(name[:16], 16): os.path.join(directory, name)
            for name in os.listdir(directory)
            if name.endswith(SUFFIX) and len(name) == 16 + len(SUFFIX)}


# -- decoding (shared by the bookie and the offline tools, which read without a bookie) --

class LogHeader(NamedTuple):
    """A log's header: its id, and where its ledger map lies (0 and 0 if not sealed)."""

    log_id: int
    map_offset: int
    map_count: int


class ScanEnd(NamedTuple):
    """Where a scan of a log's records stopped: ``reason`` is empty when the records end
    cleanly (at the ledger map or the end of the file), else what is wrong at
    ``offset``."""

    offset: int
    reason: str


def read_header(f: BinaryIO, path: str) -> LogHeader:
    """The header of the log open as ``f`` (read from offset 0); BookKeeperError if it is
    damaged or of another format version."""
    f.seek(0)
    head = f.read(HEADER_SIZE)
    if len(head) < HEADER_SIZE or head[:8] != MAGIC or \
            struct.unpack_from(">I", head, HEADER.size)[0] != crc32c(head[:HEADER.size]):
        raise BookKeeperError(f"entry log {path} has a damaged header; move it aside "
                              "if its ledgers are safe elsewhere")
    _m, version, _h, log_id, map_offset, count = HEADER.unpack_from(head)
    if version != VERSION:
        raise BookKeeperError(f"entry log {path} has format version {version}, this pybk "
                              f"reads version {VERSION}")
    return LogHeader(log_id, map_offset, count)


def read_ledger_map(f: BinaryIO, header: LogHeader) -> dict[int, int] | None:
    """A sealed log's ledger map, ``{ledger id: bytes}``; None if it is damaged."""
    f.seek(header.map_offset)
    expected = MAP_HEAD.size + MAP_ITEM.size * header.map_count + 4
    body = f.read(expected)
    if len(body) != expected or struct.unpack_from(">I", body, len(body) - 4)[0] != \
            crc32c(body[:-4]) or MAP_HEAD.unpack_from(body) != (MAP_MAGIC, header.map_count):
        return None
    return dict(MAP_ITEM.unpack_from(body, MAP_HEAD.size + i * MAP_ITEM.size)
                for i in range(header.map_count))


def scan_records(f: BinaryIO, header: LogHeader
                 ) -> Generator[tuple[Location, int, int, int, int], None, ScanEnd]:
    """Yield ``(location, ledger id, entry id, length, crc)`` of each valid record of the
    log open as ``f``, up to its ledger map (or the end of the file if not sealed); stop
    at the first damaged record.  The generator's return value is a :class:`ScanEnd`."""
    end = header.map_offset or os.fstat(f.fileno()).st_size
    offset = HEADER_SIZE
    while offset < end:
        if offset + RECORD_HEADER_SIZE + ENTRY_IDS.size > end:
            return ScanEnd(offset, "truncated record header")
        f.seek(offset)
        length, crc, rtype = RECORD.unpack(f.read(RECORD_HEADER_SIZE))
        if rtype != ADD:
            return ScanEnd(offset, f"record type {rtype}, not an entry")
        if length < ENTRY_IDS.size:
            return ScanEnd(offset, f"record of {length} bytes, too short for an entry")
        if offset + RECORD_HEADER_SIZE + length > end:
            return ScanEnd(offset, "truncated record")
        data = f.read(length)
        if entry_crc(data) != crc:
            return ScanEnd(offset, "checksum mismatch")
        ledger_id, entry_id = ENTRY_IDS.unpack_from(data)
        yield Location(header.log_id, offset), ledger_id, entry_id, length, crc
        offset += RECORD_HEADER_SIZE + length
    return ScanEnd(offset, "")


def entry_of_record(record: bytes, length: int, ledger_id: int, entry_id: int) -> bytes:
    """The entry in ``record`` (bytes read at an index location: record header, then the
    entry), checked to be entry ``(ledger_id, entry_id)`` of ``length`` bytes with a good
    checksum; CorruptData saying what differs otherwise."""
    if len(record) < RECORD_HEADER_SIZE + length:
        raise CorruptData(f"the file ends {len(record)} bytes into the record")
    stored_length, crc, rtype = RECORD.unpack_from(record)
    if rtype != ADD:
        raise CorruptData(f"record type {rtype}, not an entry")
    if stored_length != length:
        raise CorruptData(f"a record of {stored_length} bytes, not {length}")
    data = record[RECORD_HEADER_SIZE:]
    if entry_crc(data) != crc:
        raise CorruptData("checksum mismatch")
    found = ENTRY_IDS.unpack_from(data)
    if found != (ledger_id, entry_id):
        raise CorruptData(f"the record holds ledger {found[0]} entry {found[1]}")
    return data


class EntryLogger:
    """All entry logs of a bookie: appending, sealing, reading, scanning and deleting.

    ``choose_directory`` picks the ledger directory of each new log (it lets the bookie
    skip full disks).  Appends come from one thread at a time (the checkpoint or the
    compactor, serialised by the caller); reads may come from any thread.
    """

    def __init__(self, ledger_dirs: list[str], log_size_limit: int,
                 choose_directory: Callable[[], str], io: FileIO = DEFAULT_IO,
                 last_log_id: int = 0, flush_bytes: int = 0) -> None:
        self._dirs = [os.path.join(d, CURRENT) for d in ledger_dirs]
        self._size_limit = log_size_limit
        self._flush_bytes = flush_bytes
        self._unflushed = 0  # bytes appended to the current log and not yet written out
        self._choose_directory = choose_directory
        self._io = io
        self._paths: dict[int, str] = {}
        self._read_fds: dict[int, int] = {}
        self._fd_lock = threading.Lock()
        #: log id -> {ledger id: bytes}, for every log including the current one.
        self.ledger_maps: dict[int, dict[int, int]] = {}
        #: log id -> total record bytes.
        self.log_sizes: dict[int, int] = {}
        self._current_id = -1
        self._current_fd = -1
        self._current_offset = 0
        self._unsynced: list[int] = []  # rolled logs whose seal is done but data unsynced
        for directory in self._dirs:
            for name in os.listdir(directory):
                if name.endswith(SUFFIX + NEW_SUFFIX):
                    log.info("removing %s: a crash interrupted its creation", name)
                    os.unlink(os.path.join(directory, name))
            self._paths.update(list_log_files(directory))
        self.last_log_id = max([last_log_id, *self._paths])
        for log_id in sorted(self._paths):
            self._load_map(log_id)

    # -- writing -----------------------------------------------------------------

    def append_records(self, buffers: Sequence[Buffer], runs: Sequence[tuple[int, int]]
                       ) -> list[Placement]:
        """Append the records of many ledgers at once (``buffers`` = header, entry, header,
        entry, ...; ``runs`` = ``(ledger id, number of records)`` of each ledger's records,
        in the order of ``buffers``).

        Returns where they landed, numbering records through the whole call: usually one
        placement, more when the records cross ``logSizeLimit`` and the log rolls, or cross
        ``flush_bytes``.  Offsets are computed from the buffer lengths in C
        (``accumulate``), not record by record, and a step is one ``writev`` for however
        many ledgers it holds: the cost is per byte, with a few C-level operations per
        ledger for the ledger maps.  The data is durable only after :meth:`sync`.

        With ``flush_bytes`` set, the records are written in steps of about that many
        bytes, each written out to the disk before the next (BookKeeper's
        ``flushEntrylogBytes``; :meth:`FileIO.write_out`, which syncs no metadata and
        flushes no disk cache): the disk gets the checkpoint's data in small pieces, so
        a journal fdatasync on the same disk never queues behind all of it.
        """
        sizes = list(map(len, buffers))
        # ends[i]: bytes of the first i records, computed once for the whole call (each
        # step below finds its cut by bisection, so long calls stay linear).
        ends = list(itertools.accumulate(map(operator.add, sizes[0::2], sizes[1::2]),
                                         initial=0))
        # run_ends[j]: the records of the first j + 1 runs.
        run_ends = list(itertools.accumulate(map(operator.itemgetter(1), runs)))
        count = len(ends) - 1
        placements: list[Placement] = []
        first = 0
        while first < count:
            if self._current_fd < 0:
                self._roll()
            offset = self._current_offset
            base = ends[first]  # bytes before this step; the step starts at ``offset``
            # Records that end within the size limit (at least one in a fresh log).
            last = bisect.bisect_right(ends, base + self._size_limit - offset,
                                       lo=first + 1) - 1
            if last == first and offset > HEADER_SIZE:
                self._close_current()
                continue
            last = max(last, first + 1)
            if self._flush_bytes:  # up to the next flush point (at least one record)
                step = bisect.bisect_right(ends, base + self._flush_bytes - self._unflushed,
                                           lo=first + 1) - 1
                last = min(last, max(step, first + 1))
            end_offset = offset + ends[last] - base
            self._write_current(buffers[2 * first:2 * last], end_offset)
            if self._flush_bytes:
                self._unflushed += end_offset - offset
                if self._unflushed >= self._flush_bytes:
                    self._io.write_out(self._current_fd, end_offset - self._unflushed,
                                       self._unflushed)
                    self._unflushed = 0
            self._account(runs, run_ends, ends, first, last)
            placements.append((self._current_id, first,
                               list(map(operator.add, ends[first:last],
                                        itertools.repeat(offset - base)))))
            first = last
        return placements

    def _account(self, runs: Sequence[tuple[int, int]], run_ends: list[int], ends: list[int],
                 first: int, last: int) -> None:
        """Add the bytes of records ``first`` .. ``last - 1``, just written to the current
        log, to its ledger map, ledger by ledger: C-level passes over the runs, no Python
        step per ledger (a checkpoint's step may hold thousands of them)."""
        ledger_map = self.ledger_maps[self._current_id]
        run = bisect.bisect_right(run_ends, first)  # the run holding record ``first``
        stop = bisect.bisect_right(run_ends, last - 1)  # the run holding ``last - 1``
        bounds = list(map(ends.__getitem__, [first, *run_ends[run:stop], last]))
        ledger_ids = list(map(operator.itemgetter(0), runs[run:stop + 1]))
        # update() inserts as it reads, so a ledger of several runs (replay's journal
        # order) gets the sum of their bytes.
        ledger_map.update(zip(ledger_ids, map(
            operator.add, map(ledger_map.get, ledger_ids, itertools.repeat(0)),
            map(operator.sub, itertools.islice(bounds, 1, None), bounds))))

    def _write_current(self, buffers: Sequence[Buffer], end_offset: int) -> None:
        """Write buffered records to the current log, which then ends at ``end_offset``."""
        try:
            written = self._io.write_all(self._current_fd, buffers)
        except BaseException:
            # Part of the records may be in the file: offsets after them are unknown, so
            # this log takes no more appends (it is sealed, and the next append rolls).
            self._close_current()
            raise
        assert self._current_offset + written == end_offset, "entry log offset drifted"
        self._current_offset = end_offset
        self.log_sizes[self._current_id] = end_offset - HEADER_SIZE

    def sync(self) -> None:
        """Make everything appended so far durable."""
        for log_id in self._unsynced:
            self._seal_file(log_id)
        self._unsynced.clear()
        if self._current_fd >= 0:
            self._io.fdatasync(self._current_fd)
            self._unflushed = 0

    def _close_current(self) -> None:
        """Stop appending to the current log; it is sealed at the next :meth:`sync` (sealing
        needs its data durable first, and one fsync per log is enough)."""
        if self._current_fd >= 0:
            os.close(self._current_fd)
            self._unsynced.append(self._current_id)
            self._current_fd, self._current_id = -1, -1
            self._unflushed = 0

    def _roll(self) -> None:
        self._close_current()
        self.last_log_id += 1
        log_id = self.last_log_id
        directory = os.path.join(self._choose_directory(), CURRENT)
        path = os.path.join(directory, log_file_name(log_id))
        # The log gets its name only once its header is durable, so a crash never leaves
        # a .log file without a valid header (a leftover .new file is removed at start).
        fd = os.open(path + NEW_SUFFIX, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._io.write_all(fd, [_header_bytes(log_id, 0, 0)])
        self._io.fdatasync(fd)
        self._io.rename(path + NEW_SUFFIX, path)
        fsync_directory(directory)
        self._paths[log_id] = path
        self.ledger_maps[log_id] = {}
        self.log_sizes[log_id] = 0
        self._current_id, self._current_fd, self._current_offset = log_id, fd, HEADER_SIZE
        log.debug("entry log %s started", path)

    def seal_current(self) -> None:
        """Seal the current log (at shutdown): sync it, write its map, and start none."""
        self._close_current()
        self.sync()

    def _seal_file(self, log_id: int, map_offset: int | None = None) -> None:
        """fsync a log's records, append its ledger map, point the header at it, fsync."""
        path = self._paths[log_id]
        ledger_map = self.ledger_maps[log_id]
        body = MAP_HEAD.pack(MAP_MAGIC, len(ledger_map)) + b"".join(
            MAP_ITEM.pack(ledger, nbytes) for ledger, nbytes in sorted(ledger_map.items()))
        body += struct.pack(">I", crc32c(body))
        fd = os.open(path, os.O_RDWR)
        try:
            self._io.fdatasync(fd)
            offset = os.fstat(fd).st_size if map_offset is None else map_offset
            self._io.pwrite_all(fd, body, offset)
            self._io.fdatasync(fd)
            self._io.pwrite_all(fd, _header_bytes(log_id, offset, len(ledger_map)), 0)
            self._io.fdatasync(fd)
        finally:
            os.close(fd)

    # -- reading -----------------------------------------------------------------

    def read(self, location: Location, length: int, ledger_id: int, entry_id: int) -> bytes:
        """The entry ``(ledger_id, entry_id)`` at ``location`` (``length`` bytes).

        The checksum and the ids in the entry are verified, so a stale location (a log
        deleted and its descriptor reused meanwhile) raises instead of returning another
        entry's bytes.
        """
        for _ in range(2):
            fd = self._read_fd(location.log_id)
            try:
                record = os.pread(fd, RECORD_HEADER_SIZE + length, location.offset)
            except OSError:
                if self._read_fds.get(location.log_id) == fd:
                    raise
                continue  # closed to make room while this read ran
            try:
                return entry_of_record(record, length, ledger_id, entry_id)
            except CorruptData as e:
                problem = e
            if self._read_fds.get(location.log_id) == fd:
                break  # the descriptor was the log's own: the record is bad
            # else: closed to make room while this read ran; read through a new one
        raise CorruptData(f"entry log {self._paths.get(location.log_id)} holds no valid "
                          f"record of {length} bytes at offset {location.offset} "
                          f"({problem})")

    def _read_fd(self, log_id: int) -> int:
        fd = self._read_fds.get(log_id)
        if fd is None:
            with self._fd_lock:
                fd = self._read_fds.get(log_id)
                if fd is None:
                    path = self._paths.get(log_id)
                    if path is None:
                        raise CorruptData(f"the index points at entry log {log_id:x}, "
                                          "which does not exist")
                    if len(self._read_fds) >= READ_FDS_MAX:  # dicts keep insertion order
                        os.close(self._read_fds.pop(next(iter(self._read_fds))))
                    fd = os.open(path, os.O_RDONLY)
                    self._read_fds[log_id] = fd
        return fd

    def scan(self, log_id: int, strict: bool = False
             ) -> Iterator[tuple[Location, int, int, int, int]]:
        """Yield ``(location, ledger id, entry id, length, crc)`` of each valid record.

        The scan stops at the first damaged record; with ``strict``, stopping before the
        bytes its ledger map accounts for raises CorruptData instead (compaction must not
        drop what follows the damage).
        """
        path = self._paths[log_id]
        with open(path, "rb") as f:
            stop = yield from scan_records(f, read_header(f, path))
        # The ledger map counts every record the log was given (for a log sealed after a
        # crash: the valid ones before its torn tail), so stopping short of it means
        # damage in the middle.
        if strict and stop.offset - HEADER_SIZE < sum(self.ledger_maps.get(log_id, {}).values()):
            raise CorruptData(f"entry log {path}: damaged record at offset {stop.offset}")

    # -- metadata and deletion ---------------------------------------------------

    def _load_map(self, log_id: int) -> None:
        path = self._paths[log_id]
        with open(path, "rb") as f:
            header = read_header(f, path)
            if header.log_id != log_id:
                raise BookKeeperError(f"entry log {path} holds log id {header.log_id:x}, "
                                      f"expected {log_id:x}")
            if header.map_offset:
                stored = read_ledger_map(f, header)
                if stored is not None:
                    self.ledger_maps[log_id] = stored
                    self.log_sizes[log_id] = header.map_offset - HEADER_SIZE
                    return
                log.warning("entry log %s: damaged ledger map, rebuilding it", path)
        ledger_map: dict[int, int] = {}
        end = HEADER_SIZE
        for location, ledger_id, _entry, length, _crc in self.scan(log_id):
            ledger_map[ledger_id] = ledger_map.get(ledger_id, 0) + RECORD_HEADER_SIZE + length
            end = location.offset + RECORD_HEADER_SIZE + length
        self.ledger_maps[log_id] = ledger_map
        self.log_sizes[log_id] = end - HEADER_SIZE
        self._seal_file(log_id)
        log.info("entry log %s was not sealed: scanned %d ledgers, sealed it", path,
                 len(ledger_map))

    @property
    def current_log_id(self) -> int:
        """The log being appended to, or -1."""
        return self._current_id

    def log_ids(self) -> list[int]:
        return sorted(self._paths)

    def delete(self, log_id: int) -> None:
        """Remove a log file (never the current one)."""
        if log_id == self._current_id:
            raise ValueError("cannot delete the current entry log")
        with self._fd_lock:
            fd = self._read_fds.pop(log_id, None)
        if fd is not None:
            os.close(fd)
        path = self._paths.pop(log_id)
        self.ledger_maps.pop(log_id, None)
        self.log_sizes.pop(log_id, None)
        self._io.unlink(path)
        fsync_directory(os.path.dirname(path))
        log.info("deleted entry log %s", path)

    def close(self) -> None:
        """Seal the current log and close every file."""
        self.seal_current()
        with self._fd_lock:
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
