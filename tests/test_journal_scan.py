"""The journal scan returns the records written, from any record's start, and stops at the
first damaged one (garbled, of an unknown type, cut, or zeroed with records after it) with
the reason, for records of every type and of sizes from 8 bytes to 2 KiB."""

from __future__ import annotations

import pytest

from pybk.storage import journal_codec as codec

pytestmark = pytest.mark.timeout(60)

JOURNAL_ID = 1
ZEROS_AFTER = 4096  # preallocated space after the records, as on disk


def journal_records() -> list[tuple[int, bytes]]:
    """Records of every type and of many sizes."""
    records = []
    for i in range(40):
        records.append((codec.ADD, bytes([i]) * (24 + 13 * i)))
        if i % 7 == 3:
            records.append((codec.FENCE, codec.LEDGER_ID.pack(i)))
        if i % 11 == 5:
            records.append((codec.MASTER_KEY, codec.LEDGER_ID.pack(i) + b"key"))
            records.append((codec.EXPLICIT_LAC, codec.LEDGER_LAC.pack(i, i - 1)))
    records.append((codec.ADD, b"x" * 2000))
    records.append((codec.DELETE, codec.LEDGER_ID.pack(3)))
    return records


def write_journal(path: str, records: list[tuple[int, bytes]]) -> list[int]:
    """Write a journal file of ``records`` followed by zeros; return each record's start
    (and, last, where the records end)."""
    starts = [codec.HEADER_SIZE]
    with open(path, "wb") as f:
        f.write(codec.file_header(JOURNAL_ID))
        for rtype, payload in records:
            f.write(codec.record_header(rtype, payload) + payload)
            starts.append(f.tell())
        f.write(bytes(ZEROS_AFTER))
    return starts


def scan(path: str) -> tuple[list[tuple[int, bytes, int]], codec.ScanReport]:
    """Every record of a scan as ``(type, payload, end offset)``, and the report; the
    checksum of each record is checked against its payload's."""
    found = []
    scanner = codec.scan_journal(path)
    while True:
        try:
            rtype, payload, end, crc = next(scanner)
        except StopIteration as stop:
            return found, stop.value
        assert crc == codec.RECORD.unpack(codec.record_header(rtype, payload))[1]
        found.append((rtype, payload, end))


def test_scan_returns_every_record(tmp_path):
    path = str(tmp_path / codec.journal_file_name(JOURNAL_ID))
    records = journal_records()
    starts = write_journal(path, records)
    found, report = scan(path)
    assert found == [(rtype, payload, end)
                     for (rtype, payload), end in zip(records, starts[1:])]
    assert (report.records, report.end_offset, report.reason) == \
        (len(records), starts[-1], "")
    assert [end for _t, _p, end, _c in codec.scan_journal(path, starts[10])] == starts[11:]


def damage_checksum(f, start: int, size: int) -> str:
    f.seek(start + codec.RECORD.size)
    byte = f.read(1)
    f.seek(start + codec.RECORD.size)
    f.write(bytes([byte[0] ^ 0xFF]))
    return "checksum mismatch"


def damage_type(f, start: int, size: int) -> str:
    f.seek(start + 8)
    f.write(bytes([77]))
    return "unknown record type 77"


def damage_truncate(f, start: int, size: int) -> str:
    f.truncate(start + codec.RECORD.size + 1)
    return "truncated record"


def damage_zeros(f, start: int, size: int) -> str:
    """A lost page: zeros where the record was, valid records after it."""
    f.seek(start)
    f.write(bytes(codec.RECORD.size))
    return "zeros followed by data"


@pytest.mark.parametrize("damage", [damage_checksum, damage_type, damage_truncate,
                                    damage_zeros], ids=lambda d: d.__name__)
@pytest.mark.parametrize("target", [0, 3, 17, 41, -2])
def test_scan_stops_at_the_first_damaged_record(tmp_path, damage, target):
    path = str(tmp_path / codec.journal_file_name(JOURNAL_ID))
    records = journal_records()
    starts = write_journal(path, records)
    target %= len(records)
    with open(path, "r+b") as f:
        reason = damage(f, starts[target], starts[target + 1] - starts[target])
    found, report = scan(path)
    assert [end for _t, _p, end in found] == starts[1:target + 1]
    assert (report.records, report.end_offset, report.reason) == \
        (target, starts[target], reason)
