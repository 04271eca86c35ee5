"""The journal's file format: encoding records and file headers, and reading files back.

The group-commit writer (:mod:`pybk.storage.journal`) encodes with this module; the
bookie's replay and the offline tools (``pybk readjournal``) decode with it.

File format
-----------
Files live in ``<journalDirectory>/current`` and are named ``<journal id as 16 hex digits>.txn``;
ids increase by one per file.  All integers are big-endian.

Header, 32 bytes::

    0   8  magic  b"PYBKJNL1"
    8   4  format version (1)
    12  4  header length (32)
    16  8  journal id
    24  4  zero
    28  4  CRC-32C of bytes 0..27

Records follow back to back from offset 32::

    0   4  payload length N (N >= 0)
    4   4  checksum: CRC-32C of the type byte followed by the payload
    8   1  type
    9   N  payload

Record types and payloads:

=====  ============  ======================================================
type   name          payload
=====  ============  ======================================================
1      ADD           the entry bytes (they start with ledger id, entry id)
2      MASTER_KEY    ledger id (8), then the master key
3      FENCE         ledger id (8)
4      EXPLICIT_LAC  ledger id (8), LAC (8, signed)
5      DELETE        ledger id (8)
=====  ============  ======================================================

The writer preallocates files with zeros ahead of the records; a zero length with a zero
checksum (and type) marks the end of the records.

Reading guarantees
------------------
:func:`scan_batches` (batches of records, for replay) and :func:`scan_journal` (record by
record, built on it) read records in order and stop a file at the first record that is
truncated, fails its checksum or has an unknown type (a torn write), and at zeros
followed by data: nothing from there on in that file is returned, and its
:class:`ScanReport` says where and why, whatever the batch limits.  :func:`replay`
applies the records after a :class:`LogMark` file by file: records of files after a
damaged one (written after a restart) are still replayed.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from typing import Callable, Generator, Iterator, NamedTuple

from pybk.checksum import crc32c
from pybk.errors import BookKeeperError, MalformedEntry
from pybk.storage.entries import ENTRY_HEADER, ENTRY_HEADER_SIZE

log = logging.getLogger(__name__)

MAGIC = b"PYBKJNL1"
VERSION = 1
HEADER = struct.Struct(">8sIIQI")  # magic, version, header length, journal id, zero
HEADER_SIZE = HEADER.size + 4  # + CRC
assert HEADER_SIZE == 32, "the journal header is documented as 32 bytes"
RECORD = struct.Struct(">IIB")  # payload length, checksum, type
assert RECORD.size == 9, "a journal record header is documented as 9 bytes"
SUFFIX = ".txn"

ADD, MASTER_KEY, FENCE, EXPLICIT_LAC, DELETE = 1, 2, 3, 4, 5
RECORD_TYPES = frozenset((ADD, MASTER_KEY, FENCE, EXPLICIT_LAC, DELETE))
RECORD_TYPE_NAMES = {ADD: "ADD", MASTER_KEY: "MASTER_KEY", FENCE: "FENCE",
                     EXPLICIT_LAC: "EXPLICIT_LAC", DELETE: "DELETE"}
#: The CRC-32C seed of each record type: a record's checksum covers its type byte first.
TYPE_SEEDS = {t: crc32c(bytes([t])) for t in RECORD_TYPES}

#: Seed of an ADD record's checksum; entry logs store entries with the same checksum.
ENTRY_CRC_SEED = TYPE_SEEDS[ADD]

#: The payloads of records other than ADD start with these.
LEDGER_ID = struct.Struct(">Q")
LEDGER_LAC = struct.Struct(">Qq")  # EXPLICIT_LAC: ledger id, LAC

#: One record read back: ``(type, payload, offset just after it, checksum)``.
Record = tuple[int, bytes, int, int]


def record_header(record_type: int, payload: bytes) -> bytes:
    """The 9 bytes that precede ``payload`` in a journal record."""
    return RECORD.pack(len(payload), crc32c(payload, TYPE_SEEDS[record_type]), record_type)


def file_header(journal_id: int) -> bytes:
    """The 32 bytes a journal file starts with."""
    header = HEADER.pack(MAGIC, VERSION, HEADER_SIZE, journal_id, 0)
    return header + struct.pack(">I", crc32c(header))


class RecordFields(NamedTuple):
    """What a record says, decoded from its payload (by :func:`decode_payload`)."""

    ledger_id: int
    entry_id: int | None  # ADD only
    lac: int | None  # ADD: the writer's LAC carried by the entry; EXPLICIT_LAC: the LAC
    data: bytes  # ADD: the entry after its header; MASTER_KEY: the key; else empty


def decode_payload(record_type: int, payload: bytes) -> RecordFields:
    """The fields of a record's payload; MalformedEntry for an ADD whose entry is shorter
    than an entry header (the bookie never journals one)."""
    if record_type == ADD:
        if len(payload) < ENTRY_HEADER_SIZE:
            raise MalformedEntry(f"an entry of {len(payload)} bytes, shorter than its "
                                 "header")
        ledger_id, entry_id, lac = ENTRY_HEADER.unpack_from(payload)
        return RecordFields(ledger_id, entry_id, lac, payload[ENTRY_HEADER_SIZE:])
    if record_type == EXPLICIT_LAC:
        ledger_id, lac = LEDGER_LAC.unpack_from(payload)
        return RecordFields(ledger_id, None, lac, b"")
    ledger_id = LEDGER_ID.unpack_from(payload)[0]
    data = payload[LEDGER_ID.size:] if record_type == MASTER_KEY else b""
    return RecordFields(ledger_id, None, None, data)


class LogMark(NamedTuple):
    """A position in the journal: replay from here covers everything after it."""

    journal_id: int
    offset: int


def journal_file_name(journal_id: int) -> str:
    return f"{journal_id:016x}{SUFFIX}"


def list_journal_ids(directory: str) -> list[int]:
    """The ids of the journal files in ``directory``, ascending."""
    ids = []
    for name in os.listdir(directory):
        if name.endswith(SUFFIX) and len(name) == 16 + len(SUFFIX):
            try:
                ids.append(int(name[:16], 16))
            except ValueError:
                continue
    return sorted(ids)


@dataclass
class ScanReport:
    """What a scan of one journal file found: ``records`` valid ones ending at
    ``end_offset``; ``reason`` is empty when they end cleanly (at the zeros of the
    preallocated space, or at the end of the file), else why the scan stopped there, and
    ``discarded_bytes`` is what follows that point."""

    records: int = 0
    end_offset: int = HEADER_SIZE
    discarded_bytes: int = 0
    reason: str = ""


class RecordBatch:
    """Consecutive valid records of one journal file, read in one go (built by
    :func:`scan_batches`, their types and checksums already verified).

    Record ``i`` lies in ``data`` from ``bounds[i]`` (its 9-byte header) to
    ``bounds[i + 1]``; ``data[0]`` is at file offset ``base``; ``types[i]`` is its type
    and ``crcs[i]`` its checksum.
    Replay hands spans of ``data`` to the entry logs as memoryviews (no copy): ``data``
    lives as long as one of them does.
    """

    __slots__ = ("data", "base", "bounds", "types", "crcs")

    def __init__(self, data: bytes, base: int, bounds: list[int], types: list[int],
                 crcs: list[int]) -> None:
        self.data = data
        self.base = base
        self.bounds = bounds
        self.types = types
        self.crcs = crcs

    def __len__(self) -> int:
        return len(self.types)

    def payload_bytes(self, first: int = 0, last: int | None = None) -> int:
        """The payload bytes of records ``first`` .. ``last - 1`` (headers excluded)."""
        last = len(self) if last is None else last
        return self.bounds[last] - self.bounds[first] - RECORD.size * (last - first)

    def payload_starts(self, first: int = 0, last: int | None = None) -> list[int]:
        """Where the payloads of records ``first`` .. ``last - 1`` start in ``data``."""
        return list(map(RECORD.size.__add__, self.bounds[first:len(self) if last is None
                                                         else last]))

    def payload(self, i: int) -> bytes:
        """The payload of record ``i``, copied out of ``data``."""
        return self.data[self.bounds[i] + RECORD.size:self.bounds[i + 1]]

    def ledger_id(self, i: int) -> int:
        """The ledger id that starts the payload of record ``i`` (every type's does)."""
        return int(LEDGER_ID.unpack_from(self.data, self.bounds[i] + RECORD.size)[0])

    def payloads(self, first: int = 0, last: int | None = None) -> Iterator[bytes]:
        """The payloads of records ``first`` .. ``last - 1``, each copied out of ``data``."""
        last = len(self) if last is None else last
        return map(self.data.__getitem__,
                   map(slice, self.payload_starts(first, last), self.bounds[first + 1:last + 1]))


#: Most records per :class:`RecordBatch`, and most bytes read per batch (a record longer
#: than that is read whole, alone): a scan's memory stays bounded whatever the file size.
BATCH_RECORDS_MAX = 65_536
BATCH_READ_BYTES = 4 * 1024 * 1024
#: The first read of a scan; each next one doubles, up to BATCH_READ_BYTES.  A look at
#: the tail of a journal being written (a live reader's) then reads a little, not
#: megabytes of the zeros preallocated after the records.
BATCH_FIRST_READ_BYTES = 64 * 1024


def scan_batches(path: str, start_offset: int = 0,
                 check_tail: bool = True) -> Generator[RecordBatch, None, ScanReport]:
    """Yield the valid records of a journal file, in order, as :class:`RecordBatch`es.

    Starts at ``start_offset`` (the header's end when smaller) and stops at the end of
    the records or at the first damaged one.  The generator's return value is a
    :class:`ScanReport` (use ``yield from``).  Raises BookKeeperError for a file of
    another format version.  Without ``check_tail``, the zeros that end the records are
    taken as the end without reading the rest of the file: for a reader of a journal that
    a bookie is still writing, whose preallocated zeros it would otherwise read at every
    look.

    The file is read with ``pread`` a few MiB at a time, and each read is checked by one
    tight loop (:func:`_valid_records`); what ended that loop is sorted out here, once
    per batch.
    """
    report = ScanReport()
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        if size < HEADER_SIZE:
            report.reason = f"file is {size} bytes, shorter than its header"
            report.discarded_bytes = size
            return report
        head = os.pread(fd, HEADER_SIZE, 0)
        magic, version, header_len, _jid, _zero = HEADER.unpack_from(head, 0)
        (header_crc,) = struct.unpack_from(">I", head, HEADER.size)
        if magic != MAGIC or header_crc != crc32c(head[:HEADER.size]):
            report.reason = "bad header"
            report.discarded_bytes = size
            return report
        if version != VERSION or header_len != HEADER_SIZE:
            raise BookKeeperError(f"journal {path} has format version {version}, "
                                  f"this pybk reads version {VERSION}")
        pos = max(start_offset, HEADER_SIZE)
        read_bytes = min(BATCH_FIRST_READ_BYTES, BATCH_READ_BYTES)
        while True:
            wanted = min(read_bytes, size - pos)
            data = os.pread(fd, wanted, pos)
            if len(data) < wanted:
                size = pos + len(data)  # cut short since the scan began: it ends there
            read_bytes = min(2 * read_bytes, BATCH_READ_BYTES)
            bounds, types, crcs = _valid_records(data)
            if types:
                report.records += len(types)
                yield RecordBatch(data, pos, bounds, types, crcs)
            stop = bounds[-1]
            pos += stop
            if len(types) == BATCH_RECORDS_MAX:
                continue
            if pos + RECORD.size > size:
                # The file ends within a record header: a torn write unless only zeros.
                if not _all_zero(fd, pos, size):
                    report.reason = "truncated record header"
                break
            length, _crc, rtype = RECORD.unpack_from(data, stop) \
                if stop + RECORD.size <= len(data) else RECORD.unpack(
                    os.pread(fd, RECORD.size, pos))
            if not (length or _crc or rtype):
                # Preallocated zeros end the records, unless a torn write left data
                # further on (then that data is discarded, and said so).
                if check_tail and not _all_zero(fd, pos, size):
                    report.reason = "zeros followed by data"
                break
            if rtype not in RECORD_TYPES:
                report.reason = f"unknown record type {rtype}"
            elif pos + RECORD.size + length > size:
                report.reason = "truncated record"
            elif stop + RECORD.size + length <= len(data):
                report.reason = "checksum mismatch"  # it was read whole, and failed
            if report.reason:
                break
            if stop == 0:  # a record longer than a batch: read it whole
                read_bytes = RECORD.size + length
        report.end_offset = pos
        if report.reason:
            report.discarded_bytes = size - pos
    return report


def _valid_records(data: bytes) -> tuple[list[int], list[int], list[int]]:
    """The valid records at the start of ``data``: where they start, and where the last
    one ends (``bounds``), their types and their checksums.  At most
    :data:`BATCH_RECORDS_MAX`; stops at the first record that does not fit in ``data``,
    is of an unknown type (the zeros after the records too) or fails its checksum: the
    caller finds which.  The loop that steps once per record, so it does nothing else
    (a plain loop costs less here than C-level maps building columns, each of which
    makes an object per record)."""
    bounds = [0]
    types: list[int] = []
    crcs: list[int] = []
    add_bound, add_type, add_crc = bounds.append, types.append, crcs.append
    view = memoryview(data)
    unpack, header_size, seeds = RECORD.unpack_from, RECORD.size, TYPE_SEEDS
    limit = len(data)
    last_header = limit - header_size
    pos = 0
    for _ in range(BATCH_RECORDS_MAX):
        if pos > last_header:
            break
        length, crc, rtype = unpack(data, pos)
        start = pos + header_size
        pos = start + length
        if pos > limit or rtype not in seeds or crc32c(view[start:pos], seeds[rtype]) != crc:
            break
        add_bound(pos)
        add_type(rtype)
        add_crc(crc)
    return bounds, types, crcs


def scan_journal(path: str, start_offset: int = 0,
                 check_tail: bool = True) -> Generator[Record, None, ScanReport]:
    """Yield each valid :data:`Record` of a journal file, in order: :func:`scan_batches`
    (same arguments, same :class:`ScanReport` returned), one record at a time, each
    payload copied out as bytes."""
    batches = scan_batches(path, start_offset, check_tail)
    while True:
        try:
            batch = next(batches)
        except StopIteration as stop:
            report: ScanReport = stop.value
            return report
        yield from zip(batch.types, batch.payloads(),
                       map(batch.base.__add__, batch.bounds[1:]), batch.crcs)


def _all_zero(fd: int, start: int, end: int) -> bool:
    """Whether the file's bytes ``start`` .. ``end - 1`` are all zero (read a MiB at a
    time)."""
    for chunk_start in range(start, end, len(_ZEROS)):
        chunk = os.pread(fd, min(end, chunk_start + len(_ZEROS)) - chunk_start, chunk_start)
        if chunk != _ZEROS[:len(chunk)]:
            return False
    return True


_ZEROS = bytes(1 << 20)  # a MiB of zeros, to compare tails with


def replay(directory: str, mark: LogMark,
           apply: Callable[[RecordBatch], None]) -> tuple[int, int]:
    """Call ``apply(batch)`` for every :class:`RecordBatch` of valid records after
    ``mark``, in order; return (records, last journal id).

    A damaged tail ends its file (logged); later files are still replayed.
    """
    records = 0
    last_id = mark.journal_id
    for journal_id in list_journal_ids(directory):
        last_id = max(last_id, journal_id)
        if journal_id < mark.journal_id:
            continue
        path = os.path.join(directory, journal_file_name(journal_id))
        start = mark.offset if journal_id == mark.journal_id else 0
        batches = scan_batches(path, start)
        while True:
            try:
                batch = next(batches)
            except StopIteration as stop:
                report: ScanReport = stop.value
                break
            apply(batch)
        records += report.records
        if report.reason:
            log.warning("journal %s: replay stopped at offset %d (%s); %d bytes after it "
                        "were discarded", path, report.end_offset, report.reason,
                        report.discarded_bytes)
    return records, last_id
