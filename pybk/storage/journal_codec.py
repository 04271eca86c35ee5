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
:func:`scan_journal` reads records in order and stops a file at the first record that is
truncated, fails its checksum or has an unknown type (a torn write), and at zeros
followed by data: nothing from there on in that file is returned, and its
:class:`ScanReport` says where and why.  :func:`replay` applies the records after a
:class:`LogMark` file by file: records of files after a damaged one (written after a
restart) are still replayed.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Callable, Generator, NamedTuple

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


def scan_journal(path: str, start_offset: int = 0,
                 check_tail: bool = True) -> Generator[Record, None, ScanReport]:
    """Yield each valid :data:`Record` of a journal file, in order.

    Starts at ``start_offset`` (the header's end when smaller) and stops at the end of
    the records or at the first damaged one.  The generator's return value is a
    :class:`ScanReport` (use ``yield from``).  Raises BookKeeperError for a file of
    another format version.  Without ``check_tail``, the zeros that end the records are
    taken as the end without reading the rest of the file: for a reader of a journal that
    a bookie is still writing, whose preallocated zeros it would otherwise read at every
    look.
    """
    report = ScanReport()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < HEADER_SIZE:
            report.reason = f"file is {size} bytes, shorter than its header"
            report.discarded_bytes = size
            return report
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            magic, version, header_len, _jid, _zero = HEADER.unpack_from(data, 0)
            (header_crc,) = struct.unpack_from(">I", data, HEADER.size)
            if magic != MAGIC or header_crc != crc32c(data[:HEADER.size]):
                report.reason = "bad header"
                report.discarded_bytes = size
                return report
            if version != VERSION or header_len != HEADER_SIZE:
                raise BookKeeperError(f"journal {path} has format version {version}, "
                                      f"this pybk reads version {VERSION}")
            pos = max(start_offset, HEADER_SIZE)
            released = 0
            while True:
                if pos + RECORD.size > size:
                    if not _all_zero(data, pos, size):
                        report.reason = "truncated record header"
                    break
                length, crc, rtype = RECORD.unpack_from(data, pos)
                if length == 0 and crc == 0 and rtype == 0:
                    # Preallocated zeros end the records, unless a torn write left data
                    # further on (then that data is discarded, and said so).
                    if check_tail and not _all_zero(data, pos, size):
                        report.reason = "zeros followed by data"
                    break
                body_end = pos + RECORD.size + length
                if rtype not in RECORD_TYPES:
                    report.reason = f"unknown record type {rtype}"
                    break
                if body_end > size:
                    report.reason = "truncated record"
                    break
                payload = data[pos + RECORD.size:body_end]
                if crc32c(payload, TYPE_SEEDS[rtype]) != crc:
                    report.reason = "checksum mismatch"
                    break
                pos = body_end
                report.records += 1
                yield rtype, payload, pos, crc
                if pos - released >= _RELEASE_BYTES:
                    # Read pages are not needed again: keep a scan's memory bounded.
                    released = pos - pos % mmap.PAGESIZE
                    data.madvise(mmap.MADV_DONTNEED, 0, released)
            report.end_offset = pos
            if report.reason:
                report.discarded_bytes = size - pos
    return report


_ZEROS = bytes(1 << 20)  # a MiB of zeros, to compare tails with
_RELEASE_BYTES = 64 * 1024 * 1024


def _all_zero(data: mmap.mmap, start: int, end: int) -> bool:
    """Whether ``data[start:end]`` holds only zero bytes (compared a MiB at a time)."""
    for chunk_start in range(start, end, len(_ZEROS)):
        chunk = data[chunk_start:min(end, chunk_start + len(_ZEROS))]
        if chunk != _ZEROS[:len(chunk)]:
            return False
    return True


def replay(directory: str, mark: LogMark,
           apply: Callable[[int, bytes, int], None]) -> tuple[int, int]:
    """Call ``apply(type, payload, checksum)`` for every valid record after ``mark``, in
    order; return (records, last journal id).

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
        scanner = scan_journal(path, start)
        while True:
            try:
                rtype, payload, _end, crc = next(scanner)
            except StopIteration as stop:
                report: ScanReport = stop.value
                break
            apply(rtype, payload, crc)
        records += report.records
        if report.reason:
            log.warning("journal %s: replay stopped at offset %d (%s); %d bytes after it "
                        "were discarded", path, report.end_offset, report.reason,
                        report.discarded_bytes)
    return records, last_id
